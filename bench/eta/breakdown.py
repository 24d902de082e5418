"""Where the start estimates' error lies (``python -m bench.eta --engine-only --breakdown``).

The same figures as ``bench.eta.score`` (relative error, coverage), split three ways:

- ``by_wait_ahead``: by the wait still ahead of the job when the estimate was made (its
  actual start less the estimate's time). This says which estimates carry the median, but
  it sorts by the outcome: even an estimator right on the median for what it knows looks
  too late on the waits that turned out short and too early on those that turned out long
  (regression to the mean), so its signs are not the estimator's bias;
- ``by_predicted_wait``: by the wait the p50 predicted (p50 less the estimate's time): what
  the estimator knew when it spoke, so a median signed error away from 0 here is a bias
  it could correct;
- ``by_class``: by the job's priority class.

Each part: ``estimates``, ``share`` (of all judged estimates with a p50),
``median_abs_error_rel``, ``median_signed_error_s`` (p50 - actual start: above 0 the
estimate was late), ``p50_late_share`` (the actual start before the p50) and ``coverage``
(inside p50..p90).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from bench.eta import MIN_WAIT_S, Estimate, next_start
from scheduler.sim.runtimes import quantile

# Bucket edges, seconds: under 1 s (started in the cycle that estimated it), 1-2, 2-5 (a
# refresh period or two: a second's error is most of such a wait), 5-20, 20-80, over 80.
EDGES_S = (1.0, 2.0, 5.0, 20.0, 80.0)


@dataclass(frozen=True, slots=True)
class Judged:
    """An estimate with a p50, beside the start that ended its wait."""

    estimate: Estimate
    actual: float
    p50: float

    @property
    def wait_s(self) -> float:
        return self.actual - self.estimate.at

    @property
    def predicted_s(self) -> float:
        return self.p50 - self.estimate.at


def bucket(seconds: float, edges: Sequence[float] = EDGES_S) -> str:
    """The label of the bucket ``seconds`` falls in: "<1s", "1-2s", ..., ">80s"."""
    lower = None
    for edge in edges:
        if seconds < edge:
            return f"<{edge:g}s" if lower is None else f"{lower:g}-{edge:g}s"
        lower = edge
    return f">{lower:g}s"


def figures(part: Sequence[Judged], total: int) -> dict[str, float | int]:
    """The figures of one part of the estimates (see the module's docstring)."""
    relative = [abs(j.actual - j.p50) / max(MIN_WAIT_S, j.wait_s) for j in part]
    signed = [j.p50 - j.actual for j in part]
    late = [j.estimate.p90 if j.estimate.p90 is not None else float("inf") for j in part]
    inside = sum(j.p50 <= j.actual <= p90 for j, p90 in zip(part, late, strict=True))
    return {
        "estimates": len(part),
        "share": round(len(part) / total, 4),
        "median_abs_error_rel": round(quantile(relative, 0.5), 4),
        "median_signed_error_s": round(quantile(signed, 0.5), 3),
        "p50_late_share": round(sum(s > 0 for s in signed) / len(part), 4),
        "coverage": round(inside / len(part), 4),
    }


def split(judged: Sequence[Judged], key: Callable[[Judged], str]) -> dict[str, dict]:
    parts: dict[str, list[Judged]] = {}
    for j in judged:
        parts.setdefault(key(j), []).append(j)
    return {name: figures(part, len(judged)) for name, part in parts.items()}


def breakdown(
    estimates: Sequence[Estimate],
    starts: Mapping[str, Sequence[float]],
    classes: Mapping[str, str],
) -> dict[str, dict]:
    """The estimates with a p50 of jobs that started after them (``next_start``), split
    by the wait ahead, by the predicted wait and by ``classes`` (job id -> its class),
    each in the buckets' order."""
    judged = []
    for e in estimates:
        actual = next_start(starts.get(e.job, ()), e.at)
        if actual is not None and e.p50 is not None:
            judged.append(Judged(e, actual, e.p50))
    labels = [bucket(0.0), *(bucket(edge) for edge in EDGES_S)]
    by_wait = split(judged, lambda j: bucket(j.wait_s))
    by_predicted = split(judged, lambda j: bucket(j.predicted_s))
    return {
        "by_wait_ahead": {k: by_wait[k] for k in labels if k in by_wait},
        "by_predicted_wait": {k: by_predicted[k] for k in labels if k in by_predicted},
        "by_class": dict(sorted(split(judged, lambda j: classes.get(j.estimate.job, "")).items())),
    }
