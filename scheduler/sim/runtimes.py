"""Expected runtimes from the history of similar jobs, and start ranges built on them.

A job's declared max runtime is an upper bound; most jobs end well before it. The history
of finished jobs (``Finished``: its groups, how long it ran, its max) gives, per group of
similar jobs, the ratio actual / max runtime, and the runtime itself in seconds. Groups go
from narrow to wide (``groups_of``: the same user, project, job type and size; the same
user, project and type; the same project, type and size; the same project and type; the
same team and type; the same type; every job); the narrowest with at least ``min_samples``
finished jobs speaks:

- a job with a max: its max times the group's median and 90th percentile ratio (a ratio
  travels between jobs that declare different maxima), never beyond the max;
- a job without a max: the group's median and 90th percentile runtime in seconds.

The jobs still running count as lower bounds of their groups' runtimes (``Running``,
``RuntimeModel.with_running``: Kaplan-Meier, so that a group whose long runs are still going
is not known by its short runs alone, which end first). A running job that has already run
``elapsed_s`` is judged on the runs of its group that lasted at least as long (a job past
most of its group's runtimes is about to end, or is one of the long ones: its p90 is the
longest such run, or its max). Without any history the max is used (or the submitter's
estimate for the p50); a job without a max and without history runs
``unbounded_runtime_s``, a documented horizon.

``estimate_start_ranges`` adds the snapshot's running jobs to the history, then replays the
present twice through ``estimate_starts_within``: with every job at its p50 runtime (the p50
start) and at its p90 runtime (the p90 start).
``estimate_queue`` adds the positions and the cap: what the daemon stores
(scheduler/estimates/refresh.py) and what ``bench.eta`` measures.
"""

from __future__ import annotations

import bisect
import copy
import itertools
import math
from collections import defaultdict
from collections.abc import Callable, Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace

from scheduler.core import Profile, queue_order
from scheduler.core.types import JobRequest, Snapshot
from scheduler.sim.arrivals import ExpectedArrival
from scheduler.sim.estimate import StartEstimates, estimate_starts_within

Groups = tuple[Hashable, ...]  # narrowest first

# A group needs this many finished jobs before its figures replace a wider group's: fewer
# would let one unusual run set everybody's estimate.
MIN_SAMPLES = 5


def groups_of(
    project: Hashable, tenant: Hashable, job_type: str, gpu_milli: int, user: Hashable = None
) -> Groups:
    """The groups a job belongs to, narrowest first: (user, project, type, total milli-GPU),
    (user, project, type), (project, type, size), (project, type), (team, type), (type),
    every job. Without a user the user's groups are left out."""
    mine: Groups = ()
    if user is not None:
        mine = (
            ("user-project-type-size", user, project, job_type, gpu_milli),
            ("user-project-type", user, project, job_type),
        )
    return (
        *mine,
        ("project-type-size", project, job_type, gpu_milli),
        ("project-type", project, job_type),
        ("tenant-type", tenant, job_type),
        ("type", job_type),
        ("all",),
    )


def quantile(values: Sequence[float], q: float) -> float:
    """Linear interpolation between the closest ranks of sorted ``values`` (non-empty)."""
    ordered = sorted(values)
    at = q * (len(ordered) - 1)
    low, high = math.floor(at), math.ceil(at)
    return ordered[low] + (ordered[high] - ordered[low]) * (at - low)


@dataclass(frozen=True, slots=True)
class Finished:
    """One finished job of the history: its groups, how long it ran, its declared max."""

    groups: Groups
    ran_s: float
    max_s: float | None = None


@dataclass(frozen=True, slots=True)
class Running:
    """A job still running: it will run at least ``ran_s`` (a lower bound, censored)."""

    groups: Groups
    ran_s: float
    max_s: float | None = None


@dataclass(frozen=True, slots=True)
class Runtime:
    p50_s: float
    p90_s: float


class _Spread:
    """A group's runtimes (or ratios to the max) as a distribution: sorted ``values`` with
    their probability ``weights``: equal, or the Kaplan-Meier estimate's masses when running
    jobs count as lower bounds. Quantiles interpolate linearly between neighbours, each
    value standing at the middle of its weight: with equal weights, exactly ``quantile``."""

    __slots__ = ("middles", "values")

    def __init__(self, values: list[float], weights: list[float]) -> None:
        self.values = values
        below = itertools.accumulate(weights, initial=0.0)
        self.middles = [b + w / 2 for b, w in zip(below, weights, strict=False)]

    @classmethod
    def even(cls, ordered: list[float]) -> _Spread:
        """Already sorted ``ordered``, each of the same weight."""
        return cls(ordered, [1.0] * len(ordered))

    @classmethod
    def censored(cls, ended: Sequence[float], lasting: Sequence[float]) -> _Spread:
        """Kaplan-Meier over ``ended`` (runs that finished) and ``lasting`` (runs still
        going, each at least its value), as Efron's redistribution to the right: a lasting
        run's share goes to the runs longer than it. The share left past the last ended
        run goes to the lasting runs longer than it, at their values so far (as if they
        ended now: the least they will run)."""
        # at a tie an end (0) comes before a lower bound (1), as Kaplan-Meier counts
        runs = sorted([(v, 0) for v in ended] + [(v, 1) for v in lasting])
        last_end = max(ended, default=-math.inf)
        values: list[float] = []
        weights: list[float] = []
        share = 1.0 / len(runs)  # of each run still at risk
        for at, (value, kind) in enumerate(runs):
            if kind == 0 or value >= last_end:
                values.append(value)
                weights.append(share)
            else:  # this run's share, to those after it
                share += share / (len(runs) - at - 1)
        return cls(values, weights)

    @property
    def longest(self) -> float:
        return self.values[-1]

    def beyond(self, elapsed: float, ceiling: float) -> tuple[float, float]:
        """(median, p90) of the runs at least ``elapsed`` long: what is left of the
        distribution once a job has run that long. Past every value: it ends now at the
        p50 and at ``ceiling`` at the p90 (the max, or the longest run seen)."""
        first = bisect.bisect_left(self.values, elapsed)
        if first == len(self.values):
            return elapsed, max(elapsed, ceiling)
        return self._quantile(0.5, first), self._quantile(0.9, first)

    def _quantile(self, q: float, first: int) -> float:
        values, middles = self.values, self.middles
        last = len(values) - 1
        low, high = middles[first], middles[last]
        if first == last or high <= low:
            return values[last]
        target = low + q * (high - low)
        i = min(max(bisect.bisect_right(middles, target, first, last + 1) - 1, first), last - 1)
        width = middles[i + 1] - middles[i]
        share = 0.0 if width <= 0 else min(1.0, (target - middles[i]) / width)
        return values[i] + (values[i + 1] - values[i]) * share


class RuntimeModel:
    """Runtimes per group, learned from ``samples`` of finished jobs (``Finished``); the jobs
    still running (``Running``, ``with_running``) count as lower bounds of their runtimes."""

    def __init__(
        self,
        samples: Iterable[Finished],
        *,
        min_samples: int = MIN_SAMPLES,
        unbounded_runtime_s: float = 4 * 3600.0,
    ) -> None:
        ratios, seconds = _per_group(samples)
        self.min_samples = min_samples
        # a group speaks once min_samples of its jobs have finished
        self.ended_ratios = {g: sorted(v) for g, v in ratios.items() if len(v) >= min_samples}
        self.ended_seconds = {g: sorted(v) for g, v in seconds.items() if len(v) >= min_samples}
        self.ratios = {g: _Spread.even(v) for g, v in self.ended_ratios.items()}
        self.seconds = {g: _Spread.even(v) for g, v in self.ended_seconds.items()}
        self.unbounded_runtime_s = unbounded_runtime_s
        self.lasting_ratios: dict[Hashable, list[float]] = {}
        self.lasting_seconds: dict[Hashable, list[float]] = {}

    def with_running(self, running: Iterable[Running]) -> RuntimeModel:
        """This history with the jobs running now as lower bounds (Kaplan-Meier): without
        them a history sees a group's short runs end first, and expects runs too short. Only
        the groups that speak and hold a running job are estimated again."""
        ratios, seconds = _per_group(running)
        ratios = {g: v for g, v in ratios.items() if g in self.ended_ratios}
        seconds = {g: v for g, v in seconds.items() if g in self.ended_seconds}
        if not ratios and not seconds:
            return self
        model = copy.copy(self)
        # estimated again when a job first asks (most jobs stop at a narrow group)
        model.ratios, model.lasting_ratios = dict(self.ratios), ratios
        model.seconds, model.lasting_seconds = dict(self.seconds), seconds
        return model

    def _speaking(self, groups: Groups, *, bounded: bool) -> _Spread | None:
        """The narrowest of ``groups`` that speaks, its running jobs counted in."""
        spreads = self.ratios if bounded else self.seconds
        group = next((g for g in groups if g in spreads), None)
        if group is None:
            return None
        lasting = self.lasting_ratios if bounded else self.lasting_seconds
        if group in lasting:
            ended = self.ended_ratios if bounded else self.ended_seconds
            spreads[group] = _Spread.censored(ended[group], lasting.pop(group))
        return spreads[group]

    def runtime(self, job: JobRequest, groups: Groups, elapsed_s: float = 0.0) -> Runtime:
        """p50 and p90 runtime of ``job`` (from its start), which has run ``elapsed_s`` so
        far (0 when it waits): 0 <= p50 <= p90, and both within its max when it has one."""
        elapsed = max(0.0, elapsed_s)
        if job.max_runtime_s is None:
            return self._unbounded(job, groups, elapsed)
        bound = float(job.max_runtime_s)
        ratios = self._speaking(groups, bounded=True)
        if ratios is not None:
            p50, p90 = ratios.beyond(min(1.0, elapsed / bound) if bound else 1.0, 1.0)
            return Runtime(bound * p50, bound * p90)
        p50 = min(bound, job.estimated_runtime_s) if job.estimated_runtime_s else bound
        return Runtime(min(bound, max(p50, elapsed)), bound)

    def _unbounded(self, job: JobRequest, groups: Groups, elapsed: float) -> Runtime:
        runs = self._speaking(groups, bounded=False)
        if runs is not None:
            p50, p90 = runs.beyond(elapsed, max(runs.longest, elapsed))
            return Runtime(p50, p90)
        guess = job.estimated_runtime_s or self.unbounded_runtime_s
        guess = max(guess, elapsed)
        return Runtime(guess, max(guess, self.unbounded_runtime_s))


def _per_group(
    samples: Iterable[Finished | Running],
) -> tuple[dict[Hashable, list[float]], dict[Hashable, list[float]]]:
    """Each group's ratios to the max (of the samples that declare one) and seconds."""
    ratios: dict[Hashable, list[float]] = defaultdict(list)
    seconds: dict[Hashable, list[float]] = defaultdict(list)
    for sample in samples:
        ran = max(0.0, sample.ran_s)
        if sample.max_s:
            ran = min(ran, sample.max_s)  # a job is stopped at its max
        for group in sample.groups:
            seconds[group].append(ran)
            if sample.max_s:
                ratios[group].append(ran / sample.max_s)
    return ratios, seconds


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
    arrivals: Sequence[ExpectedArrival] = (),
    arrivals_in_p50: bool = True,
    arrivals_p90: Sequence[ExpectedArrival] | None = None,
) -> StartRanges:
    """Replay ``snapshot`` at p50 then at p90 runtimes. ``groups``: job id -> its groups,
    for pending and running jobs (one missing has no history); the ``arrivals`` expected
    meanwhile (``sim.arrivals``) join both replays, judged by the groups of the job each
    is like (the p90's alone without ``arrivals_in_p50``: the range then spans the present
    alone to the present with its expected arrivals). ``arrivals_p90``, when given, replaces
    ``arrivals`` in the p90 replay (the arrivals of a longer lookahead: a later start that
    more of them make likely). ``stop`` is shared: once
    it says stop, the replay under way and any after it end. When every job's p50 and p90
    runtimes are the same (no history, no max runtimes), the replays would be the same
    (a replay is deterministic): it runs once."""
    elapsed = {r.job.id: snapshot.now - r.started_at for r in snapshot.running}
    model = model.with_running(
        Running(groups.get(r.job.id, ()), elapsed[r.job.id], r.job.max_runtime_s)
        for r in snapshot.running
    )
    runtimes = {job.id: model.runtime(job, groups.get(job.id, ())) for job in snapshot.pending}
    for r in snapshot.running:
        runtimes[r.job.id] = model.runtime(r.job, groups.get(r.job.id, ()), elapsed[r.job.id])
    late = arrivals if arrivals_p90 is None else arrivals_p90
    for a in (*arrivals, *late):
        runtimes[a.job.id] = model.runtime(a.job, groups.get(a.like, ()))
    default = model.unbounded_runtime_s
    early = arrivals if arrivals_in_p50 else ()
    p50 = estimate_starts_within(
        snapshot,
        profile,
        default_runtime_s=default,
        horizon_s=horizon_s,
        runtimes={k: v.p50_s for k, v in runtimes.items()},
        stop=stop,
        arrivals=early,
    )
    if all(v.p50_s == v.p90_s for v in runtimes.values()) and tuple(early) == tuple(late):
        return StartRanges(p50, p50)
    p90 = estimate_starts_within(
        snapshot,
        profile,
        default_runtime_s=default,
        horizon_s=horizon_s,
        runtimes={k: v.p90_s for k, v in runtimes.items()},
        stop=stop,
        arrivals=late,
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
    arrivals: Sequence[ExpectedArrival] = (),
    arrivals_in_p50: bool = True,
    arrivals_p90: Sequence[ExpectedArrival] | None = None,
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
    ranges = estimate_start_ranges(
        head,
        profile,
        model,
        groups,
        horizon_s=horizon_s,
        stop=stop,
        arrivals=arrivals,
        arrivals_in_p50=arrivals_in_p50,
        arrivals_p90=arrivals_p90,
    )
    return QueueEstimate(
        positions,
        ranges.ranges(),
        ranges.p50.stopped or ranges.p90.stopped,
        max(0, len(order) - max_jobs),
    )
