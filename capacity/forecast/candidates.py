"""The models the forecaster chooses between (choose.py), each fitted to one daily series. Pure.

Two families from statsforecast, both with a weekly season: AutoETS (exponential smoothing,
its error, trend and season forms chosen by AICc) and AutoTheta (the theta method's variants).
Each on demand itself, where growth adds a steady amount a day, and on log(1 + demand), where
it multiplies: there the 80% interval widens with the level, and the centre back-transformed
is the median. Which fits a history better is decided on the history (choose.py), not here.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
from statsforecast.models import AutoETS, AutoTheta

SEASON = 7  # days: demand follows the working week
LEVEL = 80  # the p10..p90 interval


@dataclass(frozen=True)
class Band:
    """A forecast on the history's scale: the centre (p50) and the ends of its 80% interval."""

    p50: np.ndarray
    p10: np.ndarray
    p90: np.ndarray

    def finite(self) -> bool:
        return all(np.all(np.isfinite(v)) for v in (self.p50, self.p10, self.p90))


@dataclass(frozen=True)
class Candidate:
    key: str  # short, for the benchmark's --candidates
    name: str
    model: Callable[[], Any]
    log: bool

    def forecast(self, y: np.ndarray, horizon: int) -> Band:
        """Fit to `y` (daily, >= 0, at least two seasons) and forecast `horizon` days."""
        # AutoETS tries forms that divide by zero on series with long runs of zeros; it drops
        # those itself, so numpy's warnings about them say nothing to act on.
        with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
            fit = self.model().forecast(y=np.log1p(y) if self.log else y, h=horizon, level=[LEVEL])
            back = np.expm1 if self.log else np.asarray
            return Band(
                p50=back(fit["mean"]), p10=back(fit[f"lo-{LEVEL}"]), p90=back(fit[f"hi-{LEVEL}"])
            )


CANDIDATES: tuple[Candidate, ...] = (
    # First: the one taken when the history is too short to compare them.
    Candidate("ets", "AutoETS on demand", lambda: AutoETS(season_length=SEASON), log=False),
    Candidate(
        "ets-log", "AutoETS on log1p(demand)", lambda: AutoETS(season_length=SEASON), log=True
    ),
    Candidate("theta", "AutoTheta on demand", lambda: AutoTheta(season_length=SEASON), log=False),
    Candidate(
        "theta-log",
        "AutoTheta on log1p(demand)",
        lambda: AutoTheta(season_length=SEASON),
        log=True,
    ),
)
