"""The daemon's scheduling cycles as Kueue's admission attempts, served by the daemon itself.

A cycle's duration exists only in the process that ran it, and the daemon and the web server
are separate processes (separate pods on Kubernetes, so prometheus_client's multiprocess mode,
which shares a directory, cannot join them). The daemon therefore serves these two series on
its own port (`run_scheduler --metrics-port`), as Kueue's controller serves its own; every
other scheduler series is read from the database by the web server's `/metrics`.

`result`: `success` when the cycle admitted at least one job, `inadmissible` when jobs waited
and none could be admitted, `idle` when nothing waited (Kueue makes no attempt then; Gantry
still runs the cycle, for its reconcile, and its time is worth seeing).
"""

from __future__ import annotations

from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram, start_http_server

# 1 ms doubling to about 8 s: a cycle's time, from an idle cluster to a deep queue.
DURATION_BUCKETS_S = tuple(0.001 * 2**i for i in range(14))


class CycleMetrics:
    """The series of one daemon process, in a registry of their own."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.duration = Histogram(
            "gantry_admission_attempt_duration_seconds",
            "Time of a scheduling cycle, by result (success, inadmissible, idle).",
            ["result"],
            buckets=DURATION_BUCKETS_S,
            registry=self.registry,
        )
        self.attempts = Counter(
            "gantry_admission_attempts",
            "Scheduling cycles completed, by result (success, inadmissible, idle).",
            ["result"],
            registry=self.registry,
        )

    def observe(self, *, seconds: float, placed: int, considered: int) -> None:
        result = "success" if placed else "inadmissible" if considered else "idle"
        self.duration.labels(result).observe(seconds)
        self.attempts.labels(result).inc()

    def on_cycle(self, daemon: Any) -> None:
        """The daemon's `on_cycle` hook: called after each completed cycle (`daemon.last`)."""
        stats = daemon.last
        self.observe(
            seconds=sum(stats.phases_ms.values()) / 1000.0,
            placed=stats.placed,
            considered=stats.considered,
        )

    def serve(self, port: int, addr: str = "0.0.0.0") -> Any:  # noqa: S104
        """`/metrics` on a daemon thread; returns the server (`shutdown()` to stop)."""
        server, _thread = start_http_server(port, addr=addr, registry=self.registry)
        return server
