"""Fit the forecaster and the seasonal-naive baseline to one daily demand series.

The method: the candidate models (candidates.py: AutoETS and AutoTheta with a weekly season, on
demand and on log(1 + demand)) compared by an inner backtest on the history alone (choose.py),
and the best fitted to the whole history. p10 and p90 are the ends of its 80% interval, p50 its
centre. The baseline, seasonal naive (each day as the same weekday of the last week seen), is
always fitted beside: a forecast is only worth showing where it beats it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
from statsforecast.models import SeasonalNaive

from capacity.forecast.candidates import CANDIDATES, LEVEL, SEASON, Band, Candidate
from capacity.forecast.choose import MIN_FIT, choose

# A daily series: a list, or a numpy array (the benchmark's and the history's).
Series = Sequence[float] | npt.NDArray[np.float64]

METHOD = (
    "AutoETS or AutoTheta (season 7) on demand or log1p(demand), chosen per series by an inner"
    " backtest on its history; 80% interval as p10..p90 (statsforecast)"
)
BASELINE = "SeasonalNaive(season_length=7), its own 80% interval (statsforecast)"
# Below two seasons no model can estimate the weekly pattern; shorter histories get the
# baseline alone (Forecast.method says so).
MIN_HISTORY = MIN_FIT


@dataclass(frozen=True)
class Forecast:
    """`horizon` days after the last day of the history. Units are the history's (GPU-hours).

    `method` names the model fitted (the candidate chosen, or the baseline alone and why)."""

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


def _baseline(y: np.ndarray, horizon: int) -> Band:
    if len(y) < SEASON:
        # Less than one week: the last day repeated, without an interval.
        last = np.full(horizon, y[-1] if len(y) else 0.0)
        return Band(p50=last, p10=last, p90=last)
    fit = SeasonalNaive(season_length=SEASON).forecast(y=y, h=horizon, level=[LEVEL])
    return Band(p50=fit["mean"], p10=fit[f"lo-{LEVEL}"], p90=fit[f"hi-{LEVEL}"])


def forecast_demand(
    history: Series, horizon: int, candidates: Sequence[Candidate] = CANDIDATES
) -> Forecast:
    """Forecast `horizon` days (>= 1) after `history` (daily, >= 0, oldest first, >= 1 day)
    with the best of `candidates` on it (one alone: that one, as the benchmark compares)."""
    if horizon < 1:
        raise ValueError("horizon must be at least one day")
    y = np.asarray(history, dtype=float)
    if len(y) == 0 or not np.all(np.isfinite(y)) or np.any(y < 0):
        raise ValueError("history must be a non-empty series of finite, non-negative numbers")
    base = _baseline(y, horizon)
    if len(y) < MIN_HISTORY or np.all(y == y[0]):
        # Too short to fit, or constant (nothing to learn, and a model's interval would be empty).
        return _forecast(base, base, "baseline only: " + BASELINE)
    candidate = choose(y, horizon, candidates)
    band = candidate.forecast(y, horizon)
    if not band.finite():
        return _forecast(base, base, "baseline only (the fit diverged): " + BASELINE)
    return _forecast(band, base, f"{candidate.name}, chosen by an inner backtest")


def _forecast(band: Band, base: Band, method: str) -> Forecast:
    return Forecast(
        p10=_clip(band.p10),
        p50=_clip(band.p50),
        p90=_clip(band.p90),
        baseline=_clip(base.p50),
        baseline_p10=_clip(base.p10),
        baseline_p90=_clip(base.p90),
        method=method,
    )
