"""Start ranges corrected by the estimator's own record: conformal-style calibration.

The replay (``sim.runtimes``) is right about what it models and blind to the rest: jobs that
arrive after the estimate and go ahead, the daemon's admission lag (a job starts at the
cycle after its devices came back, not at that instant), runtimes that the history gets
wrong. Each of these bends the estimates of a kind of job the same way again and again. So
every estimate is kept until its job starts (``EstimateLog``), and the pair (estimate,
actual start) then becomes a score (``score``): the error of the predicted wait over that
wait plus ``floor_s``, a scale-free residual that a tiny predicted wait cannot blow up. A new
estimate's p50 is moved by the median of the p50's scores of its group, its p90 by the 90th
percentile of the p90's (conformalized quantile regression, Romano et al. 2019, on the
replay's two starts): were the future like the recorded past, the actual start would fall
before the p50 half of the time and before the p90 nine times in ten, which is what a
p50 .. p90 range promises.

Groups are the runtime groups (``runtimes.groups_of``), the narrowest with ``min_pairs``
pairs speaking; each keeps its latest ``window`` pairs, so the correction follows a load that
changes. Only settled pairs count (the job started): an estimate never learns from its own
job's future. Pure: times are the caller's clock, nothing is read.
"""

from __future__ import annotations

import bisect
import math
from collections import deque
from collections.abc import Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from scheduler.sim.runtimes import Groups, quantile

# Fewer pairs than this and a group's quantiles are noise (the 90th percentile of 20 pairs
# is the second largest): a wider group speaks.
MIN_PAIRS = 20
# Pairs kept per group, newest: the correction follows the load of the last few hundred starts.
WINDOW = 400


def score(made_at: float, predicted: float, actual: float, floor_s: float) -> float:
    """How far the actual start fell from the predicted one, over the predicted wait plus
    ``floor_s`` (> 0): 0 on time, > 0 late, -1 at most for a predicted wait of 0 s."""
    wait = max(0.0, predicted - made_at)
    return (actual - made_at - wait) / (wait + floor_s)


def wait_bucket(wait: float, floor_s: float) -> int:
    """The scale of a predicted wait, in doublings of ``floor_s``: 0 under ``floor_s`` (the
    job starts at the next refresh or so), 1 under 3 x, 2 under 7 x, and so on."""
    return int(math.log2(1.0 + max(0.0, wait) / floor_s))


def corrected(made_at: float, predicted: float, residual: float, floor_s: float) -> float:
    """The start ``predicted`` at ``made_at`` moved by a ``score``: the inverse of `score`,
    never before ``made_at``."""
    wait = max(0.0, predicted - made_at)
    return made_at + max(0.0, wait + residual * (wait + floor_s))


@dataclass(slots=True)
class Calibration:
    """The settled pairs' scores per group, for the p50 and for the p90."""

    floor_s: float
    min_pairs: int = MIN_PAIRS
    window: int = WINDOW
    p50: dict[Hashable, deque[float]] = field(default_factory=dict)
    p90: dict[Hashable, deque[float]] = field(default_factory=dict)

    def observe(
        self, groups: Groups, made_at: float, p50: float, p90: float, actual: float
    ) -> None:
        """One settled pair: an estimate made at ``made_at`` of a job that started at ``actual``."""
        for scores, predicted in ((self.p50, p50), (self.p90, p90)):
            residual = score(made_at, predicted, actual, self.floor_s)
            for cell in self._cells(groups, predicted - made_at):
                scores.setdefault(cell, deque(maxlen=self.window)).append(residual)

    def _cells(self, groups: Groups, wait: float) -> list[Hashable]:
        """Each group split by the predicted wait's scale (``wait_bucket``): a job the replay
        starts at once is right far more often than one it expects in an hour, and a
        correction learnt on the latter would move the former off its mark."""
        bucket = wait_bucket(wait, self.floor_s)
        return [(group, bucket) for group in groups]

    def adjust(
        self,
        groups: Groups,
        made_at: float,
        p50: float | None,
        p90: float | None,
        waiting: Waiting | None = None,
    ) -> tuple[float | None, float | None]:
        """The replay's (p50, p90) starts, made at ``made_at``, corrected by the narrowest of
        ``groups`` with enough pairs (unchanged without one); p90 never before p50. None
        (not within the horizon) stays None. ``waiting``: the lower bounds of the jobs still
        waiting (``EstimateLog.waiting_scores``), counted with the settled pairs."""
        early = self._moved(0, groups, made_at, p50, waiting)
        late = self._moved(1, groups, made_at, p90, waiting)
        if early is not None and late is not None:
            late = max(early, late)
        return early, late

    def _moved(
        self,
        which: int,
        groups: Groups,
        made_at: float,
        predicted: float | None,
        waiting: Waiting | None,
    ) -> float | None:
        if predicted is None:
            return None
        waiting = waiting or Waiting({}, {})
        scores = (self.p50, self.p90)[which]
        for cell in self._cells(groups, predicted - made_at):
            settled = scores.get(cell, ())
            if len(settled) + len(waiting.scores[which].get(cell, ())) >= self.min_pairs:
                residual = waiting.quantile(which, cell, settled)
                return corrected(made_at, predicted, residual, self.floor_s)
        return predicted


@dataclass(slots=True)
class Waiting:
    """Lower bounds of the scores of the estimates whose job still waits (a job waiting now
    starts no earlier than now), per cell, for the p50 ([0]) and the p90 ([1]). Without them
    the record would know only the jobs that started, the quick ones first: in a queue that
    grows, its corrections would say "sooner" while the slow ones still wait. The quantiles
    of each cell are computed once per refresh."""

    p50: dict[Hashable, list[float]]
    p90: dict[Hashable, list[float]]
    _memo: dict[tuple[int, Hashable], float] = field(default_factory=dict)

    @property
    def scores(self) -> tuple[dict[Hashable, list[float]], dict[Hashable, list[float]]]:
        return self.p50, self.p90

    def quantile(self, which: int, cell: Hashable, settled: Iterable[float]) -> float:
        """The median (p50) or 90th percentile (p90) of a cell's settled scores and these."""
        key = (which, cell)
        if key not in self._memo:
            pool = [*settled, *self.scores[which].get(cell, ())]
            self._memo[key] = quantile(pool, (0.5, 0.9)[which])
        return self._memo[key]


@dataclass(frozen=True, slots=True)
class Outstanding:
    """An estimate (the replay's, before correction) waiting for its job to start."""

    groups: Groups
    made_at: float
    p50: float
    p90: float


# Estimates kept per waiting job at most: past it every other one is dropped, so a job that
# waits for days keeps estimates from its whole wait in bounded memory.
MAX_PER_JOB = 64


# Estimates of each waiting job whose lower bounds count (``waiting_scores``): the latest,
# so that a refresh's work stays in proportion to the queue.
CENSORED_PER_JOB = 8


@dataclass(slots=True)
class EstimateLog:
    """The estimates of jobs still waiting, until their start turns them into pairs: every
    estimate, as the figures of bench.eta count them, up to ``max_per_job`` per job (then
    thinned, every other one dropped)."""

    calibration: Calibration
    max_per_job: int = MAX_PER_JOB
    waiting: dict[str, list[Outstanding]] = field(default_factory=dict)

    def record(
        self,
        made_at: float,
        ranges: Mapping[str, tuple[float | None, float | None]],
        groups: Mapping[str, Groups],
    ) -> None:
        """The replay's ranges made at ``made_at`` (those beyond the horizon are not kept)."""
        for job_id, (p50, p90) in ranges.items():
            if p50 is None or p90 is None:
                continue
            kept = self.waiting.setdefault(job_id, [])
            if len(kept) >= self.max_per_job:
                kept[:] = kept[1::2]
            kept.append(Outstanding(groups.get(job_id, ()), made_at, p50, p90))

    def settle(self, starts: Mapping[str, Sequence[float]]) -> int:
        """Jobs that left the queue (job id -> its starts, sorted): each of their estimates
        becomes a pair with the first start at or after it (the start that ended the wait
        it predicted: a job preempted and requeued waited again, and its later estimates
        predict its next start, not its first); an estimate no start followed (a stale
        read) is no pair. Returns how many pairs."""
        pairs = 0
        for job_id, when in starts.items():
            for e in self.waiting.pop(job_id, ()):
                index = bisect.bisect_left(when, e.made_at)
                if index < len(when):
                    actual = when[index]
                    self.calibration.observe(e.groups, e.made_at, e.p50, e.p90, actual)
                    pairs += 1
        return pairs

    def waiting_scores(self, now: float, latest: int = CENSORED_PER_JOB) -> Waiting:
        """``Waiting`` at ``now``: for the latest ``latest`` estimates of each job still
        waiting, the score it would have were the job starting now (its least)."""
        out = Waiting({}, {})
        calibration = self.calibration
        for kept in self.waiting.values():
            for e in kept[-latest:]:
                if e.made_at >= now:
                    continue
                for scores, predicted in zip(out.scores, (e.p50, e.p90), strict=True):
                    bound = score(e.made_at, predicted, now, calibration.floor_s)
                    for cell in calibration._cells(e.groups, predicted - e.made_at):
                        scores.setdefault(cell, []).append(bound)
        return out

    def forget(self, job_ids: Iterable[str]) -> None:
        """Jobs that left the queue without starting (cancelled): no pair."""
        for job_id in job_ids:
            self.waiting.pop(job_id, None)
