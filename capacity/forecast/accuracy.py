"""Accuracy of one forecast against what happened, with utilsforecast's metrics.

- MASE: the forecast's mean absolute error over the in-sample mean absolute error of the
  seasonal-naive forecast one season ahead (Hyndman and Koehler, 2006); below 1, the forecast
  errs less than last week's value did on the history.
- sMAPE: utilsforecast's, mean of |y - f| / (|y| + |f|): 0 (exact) to 1 (half the usual scale).
- coverage: the share of days whose actual demand fell inside p10..p90 (a good 80% interval
  covers about 0.8).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd
from utilsforecast.losses import coverage, mae, mase, smape

from capacity.forecast.candidates import LEVEL, SEASON
from capacity.forecast.fit import Series


@dataclass(frozen=True)
class Accuracy:
    mase: float
    smape: float
    coverage: float
    mae: float


def accuracy(
    *,
    train: Series,
    actual: Series,
    p50: Series,
    p10: Series,
    p90: Series,
) -> Accuracy:
    """Score one forecast. `train` is the history it was fitted on (more than one season)."""
    n_train, n = len(train), len(actual)
    if not (len(p50) == len(p10) == len(p90) == n) or n == 0:
        raise ValueError("actual, p50, p10 and p90 must be the same non-zero length")
    if n_train <= SEASON:
        raise ValueError(f"MASE needs more than {SEASON} days of training history")
    # utilsforecast's frames: one series ("demand"), days as integers.
    test = pd.DataFrame(
        {
            "unique_id": "demand",
            "ds": np.arange(n_train, n_train + n),
            "y": np.asarray(actual, dtype=float),
            "f": np.asarray(p50, dtype=float),
            f"f-lo-{LEVEL}": np.asarray(p10, dtype=float),
            f"f-hi-{LEVEL}": np.asarray(p90, dtype=float),
        }
    )
    history = pd.DataFrame(
        {"unique_id": "demand", "ds": np.arange(n_train), "y": np.asarray(train, dtype=float)}
    )
    return Accuracy(
        mase=_one(mase(test, ["f"], seasonality=SEASON, train_df=history)),
        smape=_one(smape(test, ["f"])),
        coverage=_one(coverage(test, ["f"], level=LEVEL)),
        mae=_one(mae(test, ["f"])),
    )


def _one(frame: pd.DataFrame) -> float:
    return float(frame["f"].iloc[0])
