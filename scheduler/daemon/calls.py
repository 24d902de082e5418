"""The daemon's calls to the cluster in flight: a bounded pool of threads for a backend whose
writes are network calls (`ConcurrentWrites`), or the daemon's own thread, one call after the
other, for one that is not (the simulated cluster: deterministic, as its benchmarks need).

Each call is a `Call`: what it does, which job it is for, and when it started (the per-call
deadline counts from then, not from its submission: a call queued behind others has not
stalled). The pool's threads touch no database; the daemon's thread waits for them
(`scheduler.daemon.bind`).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from scheduler.backends.base import ClusterBackend, ConcurrentWrites


@dataclass(eq=False)
class Call:
    """One call to the cluster, on its way."""

    job_id: int
    step: str  # "create", "bind" or "delete"
    what: Any  # the PodRequest, or (namespace, name, grace) for a delete
    future: Future[None] = field(default_factory=Future)
    started: float | None = None  # monotonic, once a thread runs it


class CallPool:
    """Up to `in_flight` calls at once on threads of their own; with 1, every call runs at once
    in the caller's thread. The threads live as long as the daemon: a call that outlives its
    cycle (stalled past its deadline) ends on its own request timeout, holding one slot."""

    def __init__(self, in_flight: int, monotonic: Callable[[], float] = time.monotonic) -> None:
        self.in_flight = max(1, in_flight)
        self.monotonic = monotonic
        self._threads: ThreadPoolExecutor | None = None
        self._lock = threading.Lock()

    @classmethod
    def for_backend(cls, backend: ClusterBackend) -> CallPool:
        if isinstance(backend, ConcurrentWrites):
            return cls(backend.max_in_flight)
        return cls(1)

    @property
    def threaded(self) -> bool:
        return self.in_flight > 1

    def send(self, call: Call, fn: Callable[[], None]) -> Call:
        """Run `fn` for `call` now (in order) or on a thread; its outcome lands in
        `call.future` (None, or the exception it raised)."""

        def run() -> None:
            call.started = self.monotonic()
            if not call.future.set_running_or_notify_cancel():
                return
            try:
                fn()
            except BaseException as error:  # the caller reads it from the future
                call.future.set_exception(error)
            else:
                call.future.set_result(None)

        if not self.threaded:
            run()
            return call
        with self._lock:
            if self._threads is None:
                self._threads = ThreadPoolExecutor(self.in_flight, thread_name_prefix="gantry-call")
            self._threads.submit(run)
        return call

    def close(self) -> None:
        """Stop the threads once their calls end (the daemon stops)."""
        with self._lock:
            threads, self._threads = self._threads, None
        if threads is not None:
            threads.shutdown(wait=False, cancel_futures=True)
