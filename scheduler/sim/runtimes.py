"""Expected runtimes from the history of similar jobs, and start ranges built on them.

A job's declared max runtime is an upper bound; most jobs end well before it. The history
of finished jobs gives, per group of similar jobs, the ratio actual / max runtime: its
median and 90th percentile scale a waiting or running job's max into the runtime it will
likely take (p50) and one it will rarely exceed (p90). Groups go from narrow to wide
(``groups_of``: the same project, job type and size; the same project and type; the same
team and type; the same type); the narrowest with at least ``min_samples`` finished jobs
speaks. Without history the max itself is used (or the submitter's estimate for the p50);
a job without a max runs ``unbounded_runtime_s`` in the replay, a documented horizon.

``estimate_start_ranges`` replays the present twice through ``estimate_starts_within``: with
every job at its p50 runtime (the p50 start) and at its p90 runtime (the p90 start).
``estimate_queue`` adds the positions and the cap: what the daemon stores (scheduler/eta.py)
and what ``bench.eta`` measures.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Callable, Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace

from scheduler.core import Profile, queue_order
from scheduler.core.types import JobRequest, Snapshot
from scheduler.sim.estimate import StartEstimates, estimate_starts_within

Groups = tuple[Hashable, ...]  # narrowest first

# A group needs this many finished jobs before its ratios replace a wider group's: fewer
# would let one unusual run set everybody's estimate.
MIN_SAMPLES = 5


def groups_of(project: Hashable, tenant: Hashable, job_type: str, gpu_milli: int) -> Groups:
    """The groups a job belongs to, narrowest first: (project, type, total milli-GPU),
    (project, type), (team, type), (type)."""
    return (
        ("project-type-size", project, job_type, gpu_milli),
        ("project-type", project, job_type),
        ("tenant-type", tenant, job_type),
        ("type", job_type),
    )


def quantile(values: Sequence[float], q: float) -> float:
    """Linear interpolation between the closest ranks of sorted ``values`` (non-empty)."""
    ordered = sorted(values)
    at = q * (len(ordered) - 1)
    low, high = math.floor(at), math.ceil(at)
    return ordered[low] + (ordered[high] - ordered[low]) * (at - low)


@dataclass(frozen=True, slots=True)
class Runtime:
    p50_s: float
    p90_s: float


class RuntimeModel:
    """Ratios actual / max runtime per group, from ``samples`` of (groups, ratio)."""

    def __init__(
        self,
        samples: Iterable[tuple[Groups, float]],
        *,
        min_samples: int = MIN_SAMPLES,
        unbounded_runtime_s: float = 4 * 3600.0,
    ) -> None:
        by_group: dict[Hashable, list[float]] = defaultdict(list)
        for groups, ratio in samples:
            clipped = min(1.0, max(0.0, ratio))  # a job is stopped at its max
            for group in groups:
                by_group[group].append(clipped)
        self.ratios = {
            group: (quantile(values, 0.5), quantile(values, 0.9))
            for group, values in by_group.items()
            if len(values) >= min_samples
        }
        self.unbounded_runtime_s = unbounded_runtime_s

    def ratio(self, groups: Groups) -> tuple[float, float] | None:
        """(median, p90) of the narrowest group with enough history; None without any."""
        return next((self.ratios[g] for g in groups if g in self.ratios), None)

    def runtime(self, job: JobRequest, groups: Groups) -> Runtime:
        if job.max_runtime_s is None:
            guess = job.estimated_runtime_s or self.unbounded_runtime_s
            return Runtime(guess, max(guess, self.unbounded_runtime_s))
        bound = float(job.max_runtime_s)
        ratios = self.ratio(groups)
        if ratios is not None:
            return Runtime(bound * ratios[0], bound * ratios[1])
        p50 = min(bound, job.estimated_runtime_s) if job.estimated_runtime_s else bound
        return Runtime(p50, bound)


@dataclass(frozen=True, slots=True)
class StartRanges:
    """Expected starts from p50 and p90 runtimes (see ``StartEstimates``)."""

    p50: StartEstimates
    p90: StartEstimates

    def ranges(self) -> dict[str, tuple[float | None, float | None]]:
        """job id -> (p50 start, p90 start) for the jobs both replays settled; the p90 start
        is never earlier than the p50 one (longer runtimes can let a backfill in first)."""
        out: dict[str, tuple[float | None, float | None]] = {}
        for job_id, early in self.p50.starts.items():
            if job_id not in self.p90.starts:
                continue
            late = self.p90.starts[job_id]
            if early is not None and late is not None:
                late = max(early, late)
            out[job_id] = (early, late)
        return out


def estimate_start_ranges(
    snapshot: Snapshot,
    profile: Profile,
    model: RuntimeModel,
    groups: Mapping[str, Groups],
    *,
    horizon_s: float = 7 * 86_400.0,
    stop: Callable[[], bool] | None = None,
) -> StartRanges:
    """Replay ``snapshot`` at p50 then at p90 runtimes. ``groups``: job id -> its groups,
    for pending and running jobs (one missing has no history). ``stop`` is shared: once
    it says stop, the replay under way and any after it end. When every job's p50 and p90
    runtimes are the same (no history, no max runtimes), the replays would be the same
    (a replay is deterministic): it runs once."""
    jobs = [*snapshot.pending, *(r.job for r in snapshot.running)]
    runtimes = {job.id: model.runtime(job, groups.get(job.id, ())) for job in jobs}
    default = model.unbounded_runtime_s
    p50 = estimate_starts_within(
        snapshot,
        profile,
        default_runtime_s=default,
        horizon_s=horizon_s,
        runtimes={k: v.p50_s for k, v in runtimes.items()},
        stop=stop,
    )
    if all(v.p50_s == v.p90_s for v in runtimes.values()):
        return StartRanges(p50, p50)
    p90 = estimate_starts_within(
        snapshot,
        profile,
        default_runtime_s=default,
        horizon_s=horizon_s,
        runtimes={k: v.p90_s for k, v in runtimes.items()},
        stop=stop,
    )
    return StartRanges(p50, p90)


@dataclass(frozen=True, slots=True)
class QueueEstimate:
    """``positions``: job id -> (position in its tenant's queue, in the cluster), 1-based,
    in the engine's order (``core.queue_order``); ``ranges``: see ``StartRanges.ranges``,
    for the first ``max_jobs`` of that order only; ``capped``: how many were left out."""

    positions: dict[str, tuple[int, int]]
    ranges: dict[str, tuple[float | None, float | None]]
    stopped: bool
    capped: int


def estimate_queue(
    snapshot: Snapshot,
    profile: Profile,
    model: RuntimeModel,
    groups: Mapping[str, Groups],
    *,
    max_jobs: int,
    horizon_s: float = 7 * 86_400.0,
    stop: Callable[[], bool] | None = None,
) -> QueueEstimate:
    """Positions of every queued job, and start ranges of the head of the queue: the jobs
    behind the first ``max_jobs`` cannot start before those (bar backfill), and a replay
    costs in proportion to the jobs it carries."""
    order = queue_order(snapshot, profile)
    per_tenant: dict[str, int] = {}
    positions: dict[str, tuple[int, int]] = {}
    for index, job in enumerate(order, start=1):
        per_tenant[job.tenant] = per_tenant.get(job.tenant, 0) + 1
        positions[job.id] = (per_tenant[job.tenant], index)
    head = replace(snapshot, pending=order[:max_jobs])
    ranges = estimate_start_ranges(head, profile, model, groups, horizon_s=horizon_s, stop=stop)
    return QueueEstimate(
        positions,
        ranges.ranges(),
        ranges.p50.stopped or ranges.p90.stopped,
        max(0, len(order) - max_jobs),
    )
