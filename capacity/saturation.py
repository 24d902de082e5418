"""When a pool fills up, and who fills it. Pure: plain numbers in, dataclasses out.

A pool of `capacity_gpus` GPUs at a target utilization `target` takes
capacity_gpus * 24 * target GPU-hours of demand a day. The saturation day is the first forecast
day whose demand (p50, or p90 for the cautious date) is above that; None when no day of the
horizon is. The drivers are the subtrees whose demand grows most from the last week of history
to a week at the comparison horizon.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import date, timedelta

WEEK = 7


@dataclass(frozen=True)
class Saturation:
    limit_gpu_hours_per_day: float
    p50_day: date | None
    p90_day: date | None
    explain: str


def daily_limit(capacity_gpus: float, target: float) -> float:
    """GPU-hours a day the pool takes at its target utilization."""
    if capacity_gpus < 0 or not 0 < target <= 1:
        raise ValueError("capacity must be >= 0 GPUs and the target in (0, 1]")
    return capacity_gpus * 24 * target


def first_day_over(forecast: Sequence[float], limit: float) -> int | None:
    """Index of the first value above `limit`, None if none is."""
    return next((i for i, v in enumerate(forecast) if v > limit), None)


def saturation(
    *,
    last_day: date,
    p50: Sequence[float],
    p90: Sequence[float],
    capacity_gpus: float,
    target: float,
) -> Saturation:
    """The days (after `last_day`, the history's last) forecast demand passes the limit."""
    limit = daily_limit(capacity_gpus, target)

    def when(series: Sequence[float]) -> date | None:
        index = first_day_over(series, limit)
        return None if index is None else last_day + timedelta(days=index + 1)

    p50_day, p90_day = when(p50), when(p90)
    explain = (
        f"{capacity_gpus:g} GPUs x 24 h x {target:.0%} target = {limit:,.0f} GPU-hours a day; "
        + (f"median demand passes it on {p50_day}" if p50_day else "median demand stays under it")
        + (f", the p90 on {p90_day}" if p90_day else ", the p90 too")
        + f" (forecast of {len(p50)} days after {last_day})."
    )
    return Saturation(limit, p50_day, p90_day, explain)


@dataclass(frozen=True)
class Driver:
    name: str
    recent: float  # mean GPU-hours a day, the last week of history
    ahead: float  # mean p50 GPU-hours a day, the week ending at the comparison day
    growth: float  # ahead - recent
    share: float  # of the growth of all growing subtrees (0..1; 0 for one that shrinks)


def drivers(
    series: Mapping[str, tuple[Sequence[float], Sequence[float]]], *, at_day: int
) -> list[Driver]:
    """Subtrees by growth, largest first. `series`: name -> (history, p50); `at_day`: how
    many forecast days ahead to compare (the week ending there, clipped to the forecast)."""
    rows = []
    for name, (history, p50) in series.items():
        recent = _mean(history[-WEEK:])
        end = min(max(at_day, 1), len(p50))
        ahead = _mean(p50[max(end - WEEK, 0) : end])
        rows.append((name, recent, ahead, ahead - recent))
    total = sum(g for *_, g in rows if g > 0)
    out = [
        Driver(name, recent, ahead, growth, growth / total if total and growth > 0 else 0.0)
        for name, recent, ahead, growth in rows
    ]
    return sorted(out, key=lambda d: (-d.growth, d.name))


def _mean(values: Sequence[float]) -> float:
    return sum(values) / len(values) if len(values) else 0.0
