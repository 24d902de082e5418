"""Transient API failures -> BackendError, retried by `scheduler.backends.retry`
(docs/faults.md 12).

Transient: 429 (with its Retry-After), 500, 502, 503, 504, status 0 (the client's own
connection and TLS failures), timeouts and connection resets, and the 403 of a pod created in
a namespace whose service account the controller manager has not made yet. Everything else
(404, 409, 422, other 403s) is an answer, not a failure, and is left to the caller.
"""

from __future__ import annotations

import json
import logging
import random
import time
from collections.abc import Callable
from typing import TypeVar

import urllib3
from kubernetes.client.exceptions import ApiException

from scheduler.backends import retry
from scheduler.backends.base import BackendError
from scheduler.backends.retry import RetryPolicy

logger = logging.getLogger(__name__)
T = TypeVar("T")
TRANSIENT_STATUS = frozenset({0, 429, 500, 502, 503, 504})


def retry_after_s(exc: ApiException) -> float | None:
    """The Retry-After header in seconds (the apiserver sends integers), or None."""
    headers = exc.headers or {}
    value = headers.get("Retry-After") or headers.get("retry-after")
    try:
        return max(float(value), 0.0) if value is not None else None
    except ValueError:
        return None


def describe(exc: ApiException) -> str:
    """What the server said, not only its code: `apiserver 403: Forbidden: <its message>`.
    Admission refusals (quota, Pod Security, a missing PriorityClass or service account)
    explain themselves only in the Status message, and this text reaches the job's reason."""
    text = f"apiserver {exc.status}: {exc.reason}"
    try:
        status = json.loads(exc.body) if exc.body else {}
    except (TypeError, ValueError):
        return text
    message = status.get("message") if isinstance(status, dict) else None
    return f"{text}: {message}" if message else text


def _account_not_made_yet(exc: ApiException) -> bool:
    """A 403 that is not an answer: the namespace is new and the controller manager has not
    made its `default` ServiceAccount yet (moments after the namespace; the backend creates
    a project's namespace right before its first pod), so admission refuses the pod."""
    return exc.status == 403 and "error looking up service account" in str(exc.body or "")


def as_backend_error(exc: BaseException) -> BackendError | None:
    """The BackendError an exception stands for, or None if it is not transient."""
    if isinstance(exc, BackendError):
        return exc
    if isinstance(exc, ApiException):
        if exc.status in TRANSIENT_STATUS or _account_not_made_yet(exc):
            return BackendError(describe(exc), retry_after_s(exc))
        return None
    if isinstance(exc, urllib3.exceptions.HTTPError | ConnectionError | TimeoutError):
        return BackendError(f"apiserver unreachable: {type(exc).__name__}: {exc}")
    return None


def call_with_retry(
    fn: Callable[[], T],
    policy: RetryPolicy,
    *,
    sleep: Callable[[float], None] = time.sleep,
    rand: Callable[[], float] = random.random,
    what: str = "request",
    before_try: Callable[[], None] | None = None,
) -> T:
    """`scheduler.backends.retry.call_with_retry` with the API server's transient failures
    (`as_backend_error`)."""
    return retry.call_with_retry(
        fn,
        policy,
        sleep=sleep,
        rand=rand,
        what=what,
        classify=as_backend_error,
        before_try=before_try,
    )
