"""capacity.daily: intervals of GPU use as GPU-hours per day."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from capacity.daily import DAY_S, daily_gpu_hours


@pytest.mark.parametrize(
    ("start", "end", "gpus", "expected"),
    [
        (0, 2 * DAY_S, 1, [24, 24, 0]),  # two whole days on one GPU
        (DAY_S / 2, DAY_S, 2, [24, 0, 0]),  # 12 h on 2 GPUs
        (DAY_S - 3600, DAY_S + 3600, 4, [4, 4, 0]),  # an hour either side of midnight
        (-DAY_S, DAY_S / 4, 1, [6, 0, 0]),  # started before the window: only its part inside
        (DAY_S, DAY_S / 2, 8, [0, 0, 0]),  # ends before it starts: no time
    ],
    ids=["two-days", "half-day", "across-midnight", "before-window", "reversed"],
)
def test_one_interval(start: float, end: float, gpus: float, expected: list[float]) -> None:
    got = daily_gpu_hours([start], [end], [gpus], first_day=0.0, days=3)
    assert got == pytest.approx(expected)


@settings(max_examples=50, deadline=None)
@given(
    st.lists(
        st.tuples(st.floats(0, 5 * DAY_S), st.floats(0, 5 * DAY_S), st.floats(0, 8)),
        min_size=1,
        max_size=30,
    )
)
def test_the_days_add_up_to_every_interval_inside_the_window(
    intervals: list[tuple[float, float, float]],
) -> None:
    starts, ends, gpus = zip(*intervals, strict=True)
    got = daily_gpu_hours(starts, ends, gpus, first_day=0.0, days=5)
    expected = sum(g * max(e - s, 0.0) for s, e, g in intervals) / 3600
    assert got.sum() == pytest.approx(expected, rel=1e-9, abs=1e-6)
    assert np.all(got >= -1e-9)
