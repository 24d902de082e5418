"""List-then-watch loops that survive `410 Gone`, silent ends and resets (docs/faults.md 12, 13).

The shape of client-go's reflector, reduced to what the daemon needs:

    list (all pages) -> on_sync(every object)      # rebuild: level-based truth
    watch from the list's resourceVersion -> on_event(type, object) for each change
    the stream answers 410 Gone, ends (timeout, proxy, silent close) or breaks -> list again

Every stream end is a re-list: a watch that ends silently may have lost nothing, but the
daemon cannot tell, and one list per `timeout_s` is cheap next to a missed pod.
Transient failures back off with jitter before the next list.
"""

from __future__ import annotations

import contextlib
import json
import logging
import random
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from kubernetes.client.exceptions import ApiException
from kubernetes.watch.watch import iter_resp_lines

from scheduler.backends.base import BackendError
from scheduler.backends.kubernetes.transient import as_backend_error
from scheduler.backends.retry import RetryPolicy

logger = logging.getLogger(__name__)
T = TypeVar("T")
GONE = 410

ListFn = Callable[[], tuple[list[dict[str, Any]], str]]
StreamFn = Callable[[str, int], Any]  # (resourceVersion, timeout_s) -> raw HTTP response


@dataclass
class ListWatcher(Generic[T]):
    """One resource's list/watch loop. `run_once` is one list-or-stream step (tests call it)."""

    list_all: ListFn
    open_stream: StreamFn
    parse: Callable[[dict[str, Any]], T | None]
    on_sync: Callable[[list[T]], None]
    on_event: Callable[[str, T], None]
    timeout_s: int = 300
    # Called whenever a stream ends (the server's timeout, 410 Gone, a reset, a hang broken by
    # the read timeout, close()): what the handlers were told may miss changes from then
    # until the next list's `on_sync`.
    on_lapse: Callable[[], None] = lambda: None
    policy: RetryPolicy = field(default_factory=lambda: RetryPolicy(attempts=8, cap_s=30.0))
    sleep: Callable[[float], None] = time.sleep
    rand: Callable[[], float] = random.random
    resource_version: str | None = None
    relists: int = 0
    _failures: int = 0
    _closed: bool = False
    _response: Any = field(default=None, repr=False)

    def run(self, stop: threading.Event) -> None:
        """Loop until `stop` is set (checked between events and between streams) or `close()`."""
        while not stop.is_set() and not self._closed:
            try:
                self.run_once(stop)
            except Exception:  # a 403 (RBAC), a bug in a handler: keep watching, loudly
                logger.exception("watch failed; re-listing in %.0fs", self.policy.cap_s)
                self.resource_version = None
                self.sleep(self.policy.cap_s)

    def close(self) -> None:
        """Break the open stream now (SIGTERM): an idle watch would otherwise block until the
        server ends it, up to `timeout_s`."""
        self._closed = True
        response = self._response
        if response is not None:
            with contextlib.suppress(Exception):
                response.shutdown()

    def run_once(self, stop: threading.Event | None = None) -> None:
        try:
            if self.resource_version is None:
                self._relist()
            else:
                self._stream(stop)
                self.resource_version = None  # the stream ended: re-list next
            self._failures = 0
        except _Gone:
            self.resource_version = None  # expired, not failed: re-list at once
        except ApiException as exc:
            if exc.status != GONE:
                self._back_off(exc)
            self.resource_version = None
        except Exception as exc:
            self._back_off(exc)

    def _back_off(self, exc: Exception) -> None:
        if self._closed:
            return
        error = as_backend_error(exc)
        if error is None:
            raise exc
        self.resource_version = None
        delay = self.policy.delay(self._failures, error.retry_after_s, self.rand)
        self._failures = min(self._failures + 1, 16)
        logger.warning("watch failed (%s); re-list in %.2fs", error, delay)
        self.sleep(delay)

    def _relist(self) -> None:
        items, rv = self.list_all()
        self.relists += 1
        # Set first, so that a handler reads the version of what it is handed (a handler
        # that fails sends the loop back to a list: the version is dropped there).
        self.resource_version = rv
        self.on_sync([parsed for item in items if (parsed := self.parse(item)) is not None])

    def _stream(self, stop: threading.Event | None) -> None:
        assert self.resource_version is not None
        if self._closed:
            return
        response = self._response = self.open_stream(self.resource_version, self.timeout_s)
        try:
            # close() may have run while the stream opened, finding nothing to break: without
            # this look, an idle stream would hold the caller until the server ends it.
            if self._closed or (stop is not None and stop.is_set()):
                return
            for event in _events(response):
                if event.get("type") == "ERROR":
                    _raise_error(event.get("object") or {})
                obj = event.get("object") or {}
                rv = (obj.get("metadata") or {}).get("resourceVersion")
                self.resource_version = rv or self.resource_version
                if event.get("type") != "BOOKMARK":
                    parsed = self.parse(obj)
                    if parsed is not None:
                        self.on_event(str(event.get("type")), parsed)
                if stop is not None and stop.is_set():
                    return
        finally:
            # Closed, not returned to the pool: a half-read stream would poison the connection.
            self._response = None
            self.on_lapse()
            response.close()
            response.release_conn()


def _events(response: Any) -> Iterator[dict[str, Any]]:
    for line in iter_resp_lines(response):
        if line.strip():
            yield json.loads(line)


def _raise_error(status: dict[str, Any]) -> None:
    code = int(status.get("code") or 0)
    message = f"{status.get('reason', '')}: {status.get('message', '')}"
    if code == GONE:
        logger.info("watch expired (410 Gone): %s; re-listing", message)
        raise _Gone(message)
    if code in (429, 500, 503, 504):
        raise BackendError(f"watch error {code}: {message}")
    raise ApiException(status=code, reason=message)


class _Gone(BackendError):
    """410 Gone: not a failure, but handled like one (re-list) without backoff."""

    def __init__(self, message: str) -> None:
        super().__init__(message, retry_after_s=0.0)
