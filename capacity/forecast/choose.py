"""Choose a history's model by an inner backtest on that history alone. Pure.

No candidate wins on every series: demand that grows by a steady amount is forecast best on its
own scale, demand that grows by proportions on the log scale, and ETS and Theta extrapolate a
trend differently far ahead. So each history is split at two inner origins a week apart, each
candidate fitted before and scored (mean absolute error) on the days after, and the one with
the least error over both is fitted to the whole history. Only the history is used: a backtest
that calls this sees nothing of the days it is scored on.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from capacity.forecast.candidates import CANDIDATES, SEASON, Candidate

# Each inner fit needs two seasons to estimate the weekly pattern.
MIN_FIT = 2 * SEASON


def inner_split(length: int, horizon: int) -> tuple[int, tuple[int, ...]]:
    """The inner horizon and origins for a history of `length` days forecast `horizon` ahead.

    The inner horizon is the horizon asked, shortened to a third of the history (at least a
    week) so that the inner fits keep most of it; origins that would leave under MIN_FIT days
    to fit are dropped (none left: too short to compare, the first candidate is taken)."""
    inner = min(horizon, max(SEASON, length // 3))
    origins = tuple(o for o in (length - inner - SEASON, length - inner) if o >= MIN_FIT)
    return inner, origins


def choose(y: np.ndarray, horizon: int, candidates: Sequence[Candidate] = CANDIDATES) -> Candidate:
    """The candidate with the least inner-backtest error on `y` (ties: the earlier one).

    A candidate whose inner fit is not finite is not chosen."""
    inner, origins = inner_split(len(y), horizon)
    if not origins or len(candidates) == 1:
        return candidates[0]
    errors = []
    for candidate in candidates:
        error = 0.0
        for origin in origins:
            band = candidate.forecast(y[:origin], inner)
            error += float(np.mean(np.abs(band.p50 - y[origin : origin + inner])))
        errors.append(error if np.isfinite(error) else np.inf)
    return candidates[int(np.argmin(errors))]
