"""Wait-time estimates: replay the present forward, with the arrivals expected meanwhile.

Without ``arrivals`` the replay assumes nothing else arrives; with them (``sim.arrivals``:
the jobs expected from the recent past, each with its runtime in ``runtimes``) they join
the queue at their expected times and may go ahead (higher priority, fair share).

Running jobs end at start plus their expected runtime (``runtimes[job id]`` when given, else
the submitter's estimate, else the max runtime, else ``default_runtime_s``; a job past it is
taken to end now); pending jobs run for their own. The engine inside the replay still
backfills by max runtimes only. The result is when each pending job would start under the
same profile: an estimate, and only as good as the runtimes and arrivals it rests on.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from scheduler.core import Profile
from scheduler.core.types import JobRequest, Snapshot
from scheduler.sim.arrivals import ExpectedArrival
from scheduler.sim.engine import Simulation, StartState
from scheduler.sim.workload import Cluster, SimConfig, WorkloadJob


@dataclass(frozen=True, slots=True)
class StartEstimates:
    """``starts``: job id -> expected start (virtual seconds, the clock of ``snapshot.now``),
    None when it would not start within the horizon. With ``stopped`` the replay ended
    early (``stop``): the jobs it did not start yet are missing from ``starts``, not None."""

    starts: dict[str, float | None]
    stopped: bool


def estimate_starts(
    snapshot: Snapshot,
    profile: Profile,
    *,
    default_runtime_s: float = 3600.0,
    horizon_s: float = 7 * 86_400.0,
    runtimes: Mapping[str, float] | None = None,
    arrivals: Sequence[ExpectedArrival] = (),
) -> dict[str, float | None]:
    """Expected start time (virtual seconds, same clock as ``snapshot.now``) of every
    pending job; None when it would not start within ``horizon_s``."""
    return estimate_starts_within(
        snapshot,
        profile,
        default_runtime_s=default_runtime_s,
        horizon_s=horizon_s,
        runtimes=runtimes,
        arrivals=arrivals,
    ).starts


def estimate_starts_within(
    snapshot: Snapshot,
    profile: Profile,
    *,
    default_runtime_s: float = 3600.0,
    horizon_s: float = 7 * 86_400.0,
    runtimes: Mapping[str, float] | None = None,
    stop: Callable[[], bool] | None = None,
    arrivals: Sequence[ExpectedArrival] = (),
) -> StartEstimates:
    """``estimate_starts`` on a budget: ``stop()`` is asked before each cycle of the
    replay, and True ends it there (see ``StartEstimates``). The replay also ends once
    every pending job started: what follows cannot change a first start."""
    given = runtimes or {}

    def bound(job: JobRequest) -> float:
        runtime = given.get(job.id, job.expected_runtime_s)
        return runtime if runtime is not None else default_runtime_s

    now = snapshot.now
    workload = [
        WorkloadJob(job, now, bound(job), submitted_at=job.submitted_at) for job in snapshot.pending
    ]
    workload += [WorkloadJob(a.job, a.at_s, bound(a.job)) for a in arrivals if a.at_s >= now]
    ends = {r.job.id: r.started_at + bound(r.job) for r in snapshot.running}
    start = StartState(now, snapshot.running, ends, snapshot.decayed_usage)
    cluster = Cluster(snapshot.nodes, snapshot.tenants, snapshot.priority_classes)
    config = SimConfig(horizon_s=now + horizon_s, tick_s=max(60.0, default_runtime_s / 10))
    waiting = {job.id for job in snapshot.pending}

    def settled() -> bool:
        waiting.difference_update([j for j in waiting if tracks[j].first_start is not None])
        return not waiting

    def ended() -> bool:
        return settled() or (stop is not None and stop())

    simulation = Simulation(workload, cluster, profile, (), config, start, stop=ended)
    tracks = simulation.tracks
    simulation.replay()  # the starts alone: no report's statistics
    stopped = simulation.stopped and not settled()
    pending = {job.id for job in snapshot.pending}
    starts = {
        j.id: j.first_start_s
        for j in simulation.outcomes()
        if j.id in pending and (j.first_start_s is not None or not stopped)
    }
    return StartEstimates(starts, stopped)
