"""capacity.saturation: the day forecast demand passes a pool's limit, and who drives it."""

from __future__ import annotations

from datetime import date

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from capacity.saturation import daily_limit, drivers, first_day_over, saturation

LAST = date(2026, 11, 30)


@pytest.mark.parametrize(
    ("p50", "p90", "expected_p50", "expected_p90"),
    [
        # limit: 10 GPUs x 24 h x 0.8 = 192 GPU-hours a day
        ([100, 190, 193], [150, 200, 250], date(2026, 12, 3), date(2026, 12, 2)),
        ([100, 192, 100], [192, 192, 192], None, None),  # at the limit is not over it
        ([200], [300], date(2026, 12, 1), date(2026, 12, 1)),  # full from the first day
    ],
    ids=["p90-first", "at-the-limit", "already-full"],
)
def test_the_day_demand_passes_the_limit(p50, p90, expected_p50, expected_p90) -> None:
    got = saturation(last_day=LAST, p50=p50, p90=p90, capacity_gpus=10, target=0.8)
    assert got.limit_gpu_hours_per_day == pytest.approx(192)
    assert (got.p50_day, got.p90_day) == (expected_p50, expected_p90)
    assert "192 GPU-hours a day" in got.explain


@settings(max_examples=100)
@given(
    forecast=st.lists(st.floats(0, 1e4), min_size=1, max_size=60),
    gpus=st.integers(0, 100),
    more=st.integers(1, 100),
    target=st.floats(0.05, 1),
)
def test_more_gpus_never_bring_saturation_earlier(forecast, gpus, more, target) -> None:
    before = first_day_over(forecast, daily_limit(gpus, target))
    after = first_day_over(forecast, daily_limit(gpus + more, target))
    assert after is None or (before is not None and after >= before)
    if before is not None:
        assert forecast[before] > daily_limit(gpus, target)
        assert all(v <= daily_limit(gpus, target) for v in forecast[:before])


@pytest.mark.parametrize(
    "bad", [{"capacity_gpus": -1, "target": 0.8}, {"capacity_gpus": 8, "target": 0}]
)
def test_bad_limits_are_refused(bad) -> None:
    with pytest.raises(ValueError):
        daily_limit(**bad)


def test_drivers_rank_growth_and_share_it() -> None:
    # recent = last 7 history days; ahead = the week ending at forecast day 14.
    got = drivers(
        {
            "team-alpha": ([10] * 7, [10] * 7 + [40] * 7),  # +30
            "team-bravo": ([20] * 7, [20] * 7 + [30] * 7),  # +10
            "team-charlie": ([50] * 7, [40] * 14),  # -10
        },
        at_day=14,
    )
    assert [d.name for d in got] == ["team-alpha", "team-bravo", "team-charlie"]
    assert [d.growth for d in got] == pytest.approx([30, 10, -10])
    assert [d.share for d in got] == pytest.approx([0.75, 0.25, 0])


@given(
    st.dictionaries(
        st.text(min_size=1, max_size=5),
        st.tuples(
            st.lists(st.floats(0, 1e3), min_size=1, max_size=10),
            st.lists(st.floats(0, 1e3), min_size=1, max_size=10),
        ),
        max_size=6,
    ),
    st.integers(1, 20),
)
def test_the_shares_of_growth_add_up_to_one_or_none_grows(series, at_day) -> None:
    got = drivers(series, at_day=at_day)
    total = sum(d.share for d in got)
    assert total == pytest.approx(1) or total == 0
    assert all(0 <= d.share <= 1 for d in got)
    assert [d.growth for d in got] == sorted((d.growth for d in got), reverse=True)
