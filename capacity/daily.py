"""Intervals of GPU use spread over days: the one arithmetic of daily GPU-hours. Pure.

The product's history (capacity/history.py: jobs from created to ended, allocations) and the
benchmark's openb trace (bench/forecast.py: pods from creation to deletion) both turn
(start, end, GPUs) intervals into GPU-hours per day here.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

DAY_S = 86_400.0


def _area_before(edges: np.ndarray, points: np.ndarray, weights: np.ndarray) -> np.ndarray:
    """For each edge T: sum of weights[i] * (T - points[i]) over points[i] < T."""
    order = np.argsort(points, kind="stable")
    p, w = points[order], weights[order]
    count = np.searchsorted(p, edges, side="left")
    cum_w = np.concatenate(([0.0], np.cumsum(w)))
    cum_wp = np.concatenate(([0.0], np.cumsum(w * p)))
    return cum_w[count] * edges - cum_wp[count]


def daily_gpu_hours(
    starts: Sequence[float],
    ends: Sequence[float],
    gpus: Sequence[float],
    *,
    first_day: float,
    days: int,
) -> np.ndarray:
    """GPU-hours per day for `days` days from `first_day` (seconds since an epoch, a midnight).

    Interval i holds gpus[i] GPUs from starts[i] to ends[i] (seconds; an end before its start
    counts as no time). The area under the step function of GPUs in use, integrated exactly:
    F(T) = sum g * clip(T - start, 0, end - start), differenced at midnights.
    """
    s = np.asarray(starts, dtype=float)
    e = np.maximum(np.asarray(ends, dtype=float), s)
    g = np.asarray(gpus, dtype=float)
    edges = first_day + DAY_S * np.arange(days + 1, dtype=float)
    area = _area_before(edges, s, g) - _area_before(edges, e, g)
    return np.diff(area) / 3600.0
