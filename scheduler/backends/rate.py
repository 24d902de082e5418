"""A client-side rate for a backend's API calls, as kube-scheduler's `--kube-api-qps` and
`--kube-api-burst`: a token bucket shared by every thread that calls the cluster.

`qps` tokens come back each second, up to `burst`; a call takes one, waiting for it when none
is left. `qps <= 0` turns the limit off. Thread-safe; time and sleep are injectable.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable


class TokenBucket:
    def __init__(
        self,
        qps: float,
        burst: int,
        *,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        if qps > 0 and burst < 1:
            raise ValueError(f"burst must be at least 1 when qps is set (got {burst})")
        self.qps, self.burst = qps, burst
        self._clock, self._sleep = clock, sleep
        self._tokens = float(burst)
        self._at = clock()
        self._lock = threading.Lock()
        self.waited_s = 0.0  # in total, for the cycle's statistics

    def take(self) -> float:
        """Take a token, waiting until one is free; returns the seconds waited."""
        if self.qps <= 0:
            return 0.0
        with self._lock:
            now = self._clock()
            self._tokens = min(float(self.burst), self._tokens + (now - self._at) * self.qps)
            self._at = now
            # Taken now, paid for later: the wait is the debt divided by the rate, so the
            # threads that come after queue behind this one instead of racing for tokens.
            self._tokens -= 1.0
            wait = -self._tokens / self.qps if self._tokens < 0 else 0.0
            self.waited_s += wait
        if wait > 0:
            self._sleep(wait)
        return wait
