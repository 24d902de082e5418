"""Rolling-origin backtest: fit on the days before each origin, score the next `horizon` days.

Each origin's forecast and the baseline's are scored with the same metrics (accuracy.py); the
result is the mean over origins, so every origin weighs the same whatever its demand level.
With a `window`, each fit sees only the last `window` days before its origin, as the product's
refresh sees only its history days: MASE's scale is then the seasonal-naive error on that window.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from capacity.forecast.accuracy import Accuracy, accuracy
from capacity.forecast.candidates import CANDIDATES, SEASON, Candidate
from capacity.forecast.fit import Series, forecast_demand


@dataclass(frozen=True)
class Backtest:
    """Mean accuracy over the origins, of the forecast and of the seasonal-naive baseline.

    `relative_mae` is the forecast's MAE over the baseline's on the same days (below 1: the
    forecast beats the baseline out of sample). It is not MASE: MASE divides by the baseline's
    error in sample, on the training window; `baseline.mase` is the baseline's own MASE."""

    forecast: Accuracy
    baseline: Accuracy
    relative_mae: float
    horizon_days: int
    origins: tuple[int, ...]
    methods: tuple[str, ...]  # the model fitted at each origin


def rolling_origins(length: int, horizon: int, count: int, step: int) -> tuple[int, ...]:
    """`count` origins `step` days apart, the last one leaving exactly `horizon` days to score.

    An origin is the number of days before it; the earliest must leave two seasons to fit."""
    last = length - horizon
    origins = tuple(range(last - step * (count - 1), last + 1, step))
    if count < 1 or step < 1 or not origins or origins[0] < 2 * SEASON:
        raise ValueError(
            f"{length} days cannot hold {count} origins {step} days apart"
            f" with a {horizon}-day horizon"
        )
    return origins


def weekly_origins(length: int, horizon: int, count: int) -> tuple[int, ...]:
    """`count` origins a week apart (rolling_origins)."""
    return rolling_origins(length, horizon, count, SEASON)


def _mean(scores: list[Accuracy]) -> Accuracy:
    return Accuracy(
        mase=float(np.mean([s.mase for s in scores])),
        smape=float(np.mean([s.smape for s in scores])),
        coverage=float(np.mean([s.coverage for s in scores])),
        mae=float(np.mean([s.mae for s in scores])),
    )


def backtest(
    history: Series,
    horizon: int,
    origins: Sequence[int],
    *,
    window: int | None = None,
    candidates: Sequence[Candidate] = CANDIDATES,
    fit_horizon: int = 0,
) -> Backtest:
    """Score forecasts made at each origin over `horizon` days, each fitted on the days before
    its origin (the last `window` of them when given; more than a season), with the best of
    `candidates` there (forecast_demand). With a longer `fit_horizon`, each forecast is made
    that far ahead and its first `horizon` days scored, as the product reads 30 and 90 days off
    its one 180-day forecast (the choice of model then sees the longer horizon)."""
    y = np.asarray(history, dtype=float)
    if window is not None and window <= SEASON:
        raise ValueError(f"a training window must be longer than {SEASON} days")
    ours: list[Accuracy] = []
    naive: list[Accuracy] = []
    methods: list[str] = []
    for origin in origins:
        if origin + horizon > len(y) or origin <= SEASON:
            raise ValueError(f"origin {origin} leaves no room for a {horizon}-day horizon")
        train = y[max(0, origin - window) if window else 0 : origin]
        actual = y[origin : origin + horizon]
        fc = forecast_demand(train, max(horizon, fit_horizon), candidates)
        methods.append(fc.method)
        ours.append(
            accuracy(
                train=train,
                actual=actual,
                p50=fc.p50[:horizon],
                p10=fc.p10[:horizon],
                p90=fc.p90[:horizon],
            )
        )
        naive.append(
            accuracy(
                train=train,
                actual=actual,
                p50=fc.baseline[:horizon],
                p10=fc.baseline_p10[:horizon],
                p90=fc.baseline_p90[:horizon],
            )
        )
    forecast, baseline = _mean(ours), _mean(naive)
    return Backtest(
        forecast=forecast,
        baseline=baseline,
        relative_mae=forecast.mae / baseline.mae if baseline.mae else float("nan"),
        horizon_days=horizon,
        origins=tuple(origins),
        methods=tuple(methods),
    )
