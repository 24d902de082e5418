"""A cycle's record (`CycleStats`, with each phase's wall time) and whether the next cycle
should follow at once (`go_again`), how cycles went as the lease row reports it
(`CycleReports`), and the garbage collector's settings while the loop runs."""

from __future__ import annotations

import contextlib
import gc
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

from django.db import DatabaseError

from scheduler.daemon.state import Clock
from scheduler.leader import Lease

# Seconds of the daemon's clock between two reports of completed cycles (`CycleReports`).
REPORT_EVERY_S = 5.0
# Seconds of the daemon's clock without a failed cycle before the failures counted for
# /healthz are cleared (`CycleReports`).
FAILURES_KEPT_S = 60.0


@dataclass
class CycleStats:
    cycle: int
    epoch: int | None
    considered: int = 0
    placed: int = 0
    pods_bound: int = 0
    bind_failed: int = 0
    preempted: int = 0
    reconciled: int = 0  # jobs reconcile moved (ended, failed, requeued, claims released)
    started: int = 0  # jobs whose pods were seen running (binding -> running)
    # Milli-GPU of usable devices left free once this cycle's placements hold theirs; None
    # when the engine held no base to tell.
    gpu_left: int | None = None
    released: int = 0
    orphans: int = 0
    phases_ms: dict[str, float] = field(default_factory=dict)


def go_again(stats: CycleStats) -> bool:
    """Whether the next cycle may decide something this one could not, so it should follow
    at once. What reconcile ended, released or requeued, this cycle's snapshot already saw;
    what changes after it (a pod ends, a job is queued) wakes the loop as an event. What is
    left: jobs were placed while GPUs are left free (the queue window moves on, and the jobs
    behind those placed may take what is left), a bind failed (its devices are free again),
    or jobs were preempted. Placements that took every usable GPU leave the jobs behind
    them nothing to take but by preemption, which they get at the next event or poll, as
    they would have had no job been placed; pods seen started free nothing."""
    if stats.bind_failed or stats.preempted:
        return True
    return bool(stats.placed) and stats.gpu_left != 0


# Young collections every this many allocations (Python's default: 700), older ones rarer.
GC_THRESHOLDS = (10_000, 50, 50)


@contextlib.contextmanager
def collector_for_the_loop() -> Iterator[None]:
    """While the daemon's loop runs: what exists before it (modules, settings, the first
    caches) leaves the collector's view (`gc.freeze`), and young collections come every
    10,000 allocations. A cycle makes hundreds of thousands of short-lived objects (rows,
    requests, decisions); with the defaults, full collections ran in the middle of cycles
    (bench/results.md, daemon_drain). Both are restored when the loop ends."""
    before = gc.get_threshold()
    gc.freeze()
    gc.set_threshold(*GC_THRESHOLDS)
    try:
        yield
    finally:
        gc.set_threshold(*before)
        gc.unfreeze()


class Phases:
    """`with phases("name"):` records the phase's wall time in milliseconds."""

    def __init__(self, stats: CycleStats) -> None:
        self.stats = stats

    def __call__(self, name: str) -> _Phase:
        return _Phase(self.stats, name)


class _Phase:
    def __init__(self, stats: CycleStats, name: str) -> None:
        self.stats, self.name = stats, name

    def __enter__(self) -> None:
        self.started = time.perf_counter()

    def __exit__(self, *exc: object) -> None:
        self.stats.phases_ms[self.name] = round((time.perf_counter() - self.started) * 1000, 2)


class CycleReports:
    """How the cycles go, recorded in the lease row (`Lease.record_cycle`) for /healthz and
    the platform admins: every failure, and a completed cycle after a failure or once every
    REPORT_EVERY_S of the daemon's clock. The failures counted there are cleared only by a
    cycle that completes FAILURES_KEPT_S after the last failure: cycles that fail now and
    then, with completed ones between them, add up (a completed cycle that cleared them
    at once kept /healthz at "ok" through a failure every few cycles). A database that is
    down cannot take the report; /healthz then says so itself."""

    def __init__(self, lease: Lease, clock: Clock) -> None:
        self.lease, self.clock = lease, clock
        self._failing, self._reported_at = False, float("-inf")
        self._failed_at = float("-inf")
        self._counted = False  # the row counts failures that no report has cleared yet

    def __call__(self, error: str | None) -> None:
        now = self.clock.now()
        if error is not None:
            self._failed_at = now
        clear = error is None and now - self._failed_at >= FAILURES_KEPT_S
        due = self._failing or (clear and self._counted)
        if error is None and not due and now - self._reported_at < REPORT_EVERY_S:
            return
        try:
            self.lease.record_cycle(error, clear=clear)
        except DatabaseError:
            return
        self._failing, self._reported_at = error is not None, now
        self._counted = error is not None or (self._counted and not clear)
