"""Fit the forecaster and the seasonal-naive baseline to one daily demand series.

The method: AutoETS (statsforecast) with a weekly season, fitted to log(1 + demand). Demand
grows by proportions and cannot go below zero, so the model works where changes add up: the
80% interval it gives there becomes a band that widens with the level, never negative, and
its centre back-transformed is the median (p50) of the forecast demand. p10 and p90 are the
ends of that 80% interval. The baseline, seasonal naive (each day as the same weekday of the
last week seen), is always fitted beside: a forecast is only worth showing where it beats it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
from statsforecast.models import AutoETS, SeasonalNaive

# A daily series: a list, or a numpy array (the benchmark's and the history's).
Series = Sequence[float] | npt.NDArray[np.float64]

SEASON = 7  # days: demand follows the working week
LEVEL = 80  # the p10..p90 interval
METHOD = "AutoETS(season_length=7) on log1p(demand), 80% interval as p10..p90 (statsforecast)"
BASELINE = "SeasonalNaive(season_length=7), its own 80% interval (statsforecast)"
# Below two seasons AutoETS cannot estimate the weekly pattern; shorter histories get the
# baseline alone (Forecast.method says so).
MIN_HISTORY = 2 * SEASON


@dataclass(frozen=True)
class Forecast:
    """`horizon` days after the last day of the history. Units are the history's (GPU-hours)."""

    p10: tuple[float, ...]
    p50: tuple[float, ...]
    p90: tuple[float, ...]
    baseline: tuple[float, ...]
    baseline_p10: tuple[float, ...]
    baseline_p90: tuple[float, ...]
    method: str

    @property
    def horizon(self) -> int:
        return len(self.p50)


def _clip(values: np.ndarray) -> tuple[float, ...]:
    return tuple(float(v) for v in np.maximum(values, 0.0))


def _baseline(y: np.ndarray, horizon: int) -> dict[str, np.ndarray]:
    if len(y) < SEASON:
        # Less than one week: the last day repeated, without an interval.
        last = np.full(horizon, y[-1] if len(y) else 0.0)
        return {"mean": last, f"lo-{LEVEL}": last, f"hi-{LEVEL}": last}
    return SeasonalNaive(season_length=SEASON).forecast(y=y, h=horizon, level=[LEVEL])


def forecast_demand(history: Series, horizon: int) -> Forecast:
    """Forecast `horizon` days (>= 1) after `history` (daily, >= 0, oldest first, >= 1 day)."""
    if horizon < 1:
        raise ValueError("horizon must be at least one day")
    y = np.asarray(history, dtype=float)
    if len(y) == 0 or not np.all(np.isfinite(y)) or np.any(y < 0):
        raise ValueError("history must be a non-empty series of finite, non-negative numbers")
    base = _baseline(y, horizon)
    if len(y) < MIN_HISTORY or np.all(y == y[0]):
        # Too short to fit, or constant (nothing to learn, and ETS's interval would be empty).
        return _from_baseline(base, "baseline only: " + BASELINE)
    # AutoETS tries models that divide by zero on series with long runs of zeros; it drops
    # those candidates itself, so numpy's warnings about them say nothing to act on.
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        fit = AutoETS(season_length=SEASON).forecast(y=np.log1p(y), h=horizon, level=[LEVEL])
    if not all(np.all(np.isfinite(v)) for v in fit.values()):
        return _from_baseline(base, "baseline only (the fit diverged): " + BASELINE)
    return Forecast(
        p10=_clip(np.expm1(fit[f"lo-{LEVEL}"])),
        p50=_clip(np.expm1(fit["mean"])),
        p90=_clip(np.expm1(fit[f"hi-{LEVEL}"])),
        baseline=_clip(base["mean"]),
        baseline_p10=_clip(base[f"lo-{LEVEL}"]),
        baseline_p90=_clip(base[f"hi-{LEVEL}"]),
        method=METHOD,
    )


def _from_baseline(base: dict[str, np.ndarray], method: str) -> Forecast:
    mean, lo, hi = _clip(base["mean"]), _clip(base[f"lo-{LEVEL}"]), _clip(base[f"hi-{LEVEL}"])
    return Forecast(
        p10=lo, p50=mean, p90=hi, baseline=mean, baseline_p10=lo, baseline_p90=hi, method=method
    )
