"""Rolling-origin backtest: fit on the days before each origin, score the next `horizon` days.

Each origin's forecast and the baseline's are scored with the same metrics (accuracy.py); the
result is the mean over origins, so every origin weighs the same whatever its demand level.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from capacity.forecast.accuracy import Accuracy, accuracy
from capacity.forecast.fit import SEASON, Series, forecast_demand


@dataclass(frozen=True)
class Backtest:
    """Mean accuracy over the origins, of the forecast and of the seasonal-naive baseline.

    `relative_mae` is the forecast's MAE over the baseline's on the same days (below 1: the
    forecast beats the baseline out of sample)."""

    forecast: Accuracy
    baseline: Accuracy
    relative_mae: float
    horizon_days: int
    origins: tuple[int, ...]


def weekly_origins(length: int, horizon: int, count: int) -> tuple[int, ...]:
    """`count` origins a week apart, the last one leaving exactly `horizon` days to score.

    An origin is the number of days fitted on; the earliest must leave two seasons to fit."""
    last = length - horizon
    origins = tuple(o for o in range(last - SEASON * (count - 1), last + 1, SEASON))
    if count < 1 or not origins or origins[0] < 2 * SEASON:
        raise ValueError(
            f"{length} days cannot hold {count} weekly origins with a {horizon}-day horizon"
        )
    return origins


def _mean(scores: list[Accuracy]) -> Accuracy:
    return Accuracy(
        mase=float(np.mean([s.mase for s in scores])),
        smape=float(np.mean([s.smape for s in scores])),
        coverage=float(np.mean([s.coverage for s in scores])),
        mae=float(np.mean([s.mae for s in scores])),
    )


def backtest(history: Series, horizon: int, origins: Sequence[int]) -> Backtest:
    """Score forecasts made at each origin (days of `history` fitted on) over `horizon` days."""
    y = np.asarray(history, dtype=float)
    ours: list[Accuracy] = []
    naive: list[Accuracy] = []
    for origin in origins:
        if origin + horizon > len(y) or origin <= SEASON:
            raise ValueError(f"origin {origin} leaves no room for a {horizon}-day horizon")
        train, actual = y[:origin], y[origin : origin + horizon]
        fc = forecast_demand(train, horizon)
        ours.append(accuracy(train=train, actual=actual, p50=fc.p50, p10=fc.p10, p90=fc.p90))
        naive.append(
            accuracy(
                train=train,
                actual=actual,
                p50=fc.baseline,
                p10=fc.baseline_p10,
                p90=fc.baseline_p90,
            )
        )
    forecast, baseline = _mean(ours), _mean(naive)
    return Backtest(
        forecast=forecast,
        baseline=baseline,
        relative_mae=forecast.mae / baseline.mae if baseline.mae else float("nan"),
        horizon_days=horizon,
        origins=tuple(origins),
    )
