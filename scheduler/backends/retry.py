"""The one retry layer between the daemon and a cluster: every backend retries its own
transient failures here, with bounded, jittered backoff, and fences each try of a write.

The daemon does not retry on top (it fences and calls once, `scheduler.daemon.cluster`): a
write costs at most `RetryPolicy.attempts` calls to the cluster.
"""

from __future__ import annotations

import contextlib
import logging
import random
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TypeVar

from scheduler.backends.base import BackendError

logger = logging.getLogger(__name__)
T = TypeVar("T")


@dataclass(frozen=True)
class RetryPolicy:
    """At most `attempts` tries; full-jitter exponential backoff, never above `cap_s`.

    A Retry-After above `cap_s` is not slept here: the BackendError goes up with it, so the
    daemon (which has other work) waits instead of this call.
    """

    attempts: int = 3
    base_s: float = 0.1
    cap_s: float = 2.0

    def delay(self, attempt: int, retry_after: float | None, rand: Callable[[], float]) -> float:
        backoff = min(self.cap_s, self.base_s * (2**attempt)) * rand()
        return max(backoff, retry_after or 0.0)


class WriteFence:
    """The check a backend runs before every try of a write (`FencedWrites.fenced`): the
    innermost `held` block's, or none outside any. Blocks nest, so daemons sharing one
    backend in a test each fence their own calls."""

    def __init__(self) -> None:
        self.check: Callable[[], None] | None = None

    @contextlib.contextmanager
    def held(self, check: Callable[[], None]) -> Iterator[None]:
        before, self.check = self.check, check
        try:
            yield
        finally:
            self.check = before


def transient(exc: BaseException) -> BackendError | None:
    """The failures a backend raises as BackendError are transient; nothing else is."""
    return exc if isinstance(exc, BackendError) else None


def call_with_retry(
    fn: Callable[[], T],
    policy: RetryPolicy,
    *,
    sleep: Callable[[float], None] = time.sleep,
    rand: Callable[[], float] = random.random,
    what: str = "request",
    classify: Callable[[BaseException], BackendError | None] = transient,
    before_try: Callable[[], None] | None = None,
) -> T:
    """Run `fn`; retry the failures `classify` calls transient, per `policy`; raise the last
    as BackendError. `before_try` runs before every try (the daemon's fence of a write:
    a try after a stall or a backoff is checked again, and a stale leader sends nothing)."""
    for attempt in range(policy.attempts):
        if before_try is not None:
            before_try()
        try:
            return fn()
        except Exception as exc:
            error = classify(exc)
            if error is None:
                raise
            last_try = attempt == policy.attempts - 1
            if last_try or (error.retry_after_s or 0.0) > policy.cap_s:
                if error is exc:
                    raise
                raise error from exc
            delay = policy.delay(attempt, error.retry_after_s, rand)
            logger.warning("%s failed (%s); retry %d in %.2fs", what, error, attempt + 1, delay)
            sleep(delay)
    raise AssertionError("unreachable: attempts must be >= 1")
