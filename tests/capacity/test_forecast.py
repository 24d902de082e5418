"""capacity.forecast: the forecaster's promises (bands ordered, never negative, the horizon
asked), the metrics on hand-worked numbers, and the rolling-origin backtest on a generated
series whose baseline score is known exactly."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from capacity.forecast import (
    CANDIDATES,
    Candidate,
    accuracy,
    backtest,
    choose,
    forecast_demand,
    rolling_origins,
    weekly_origins,
)
from capacity.forecast.choose import inner_split

WEEK = np.array([1.0, 1.1, 1.1, 1.0, 0.9, 0.5, 0.4])


def linear_weekly(days: int, *, base: float = 100.0, slope: float = 2.0) -> np.ndarray:
    t = np.arange(days)
    return (base + slope * t) * WEEK[t % 7]


@settings(max_examples=15, deadline=None)
@given(
    history=st.lists(st.floats(0, 1e5, allow_nan=False), min_size=1, max_size=60),
    horizon=st.integers(1, 40),
)
def test_the_band_is_ordered_non_negative_and_as_long_as_the_horizon(
    history: list[float], horizon: int
) -> None:
    fc = forecast_demand(history, horizon)
    for series in (fc.p10, fc.p50, fc.p90, fc.baseline, fc.baseline_p10, fc.baseline_p90):
        assert len(series) == horizon
        assert min(series) >= 0
    assert all(
        lo <= mid + 1e-6 and mid <= hi + 1e-6
        for lo, mid, hi in zip(fc.p10, fc.p50, fc.p90, strict=True)
    )


def test_a_constant_history_forecasts_itself() -> None:
    fc = forecast_demand([42.0] * 30, 10)
    assert fc.p50 == pytest.approx([42.0] * 10)
    assert fc.p10 == pytest.approx([42.0] * 10)
    assert fc.method.startswith("baseline only")


def test_a_short_history_gets_the_baseline_alone() -> None:
    # Under two weeks: seasonal naive repeats the last week seen (days 3..9 here).
    fc = forecast_demand(list(range(10)), 7)
    assert fc.p50 == pytest.approx([3, 4, 5, 6, 7, 8, 9])
    assert fc.method.startswith("baseline only")


def test_growth_is_followed_where_the_baseline_stays_flat() -> None:
    history = linear_weekly(140)
    fc = forecast_demand(history, 28)
    actual = linear_weekly(168)[140:]
    # Seasonal naive repeats the last week: week w ahead it is short by 2 * 7 * w times the
    # weekday factor, against a level near 100 + 2 * 154 = 408: (14 * 2.5) / 408 = 8.5% on
    # average over the 4 weeks. The fit follows the trend.
    assert np.mean(np.abs(np.array(fc.p50) - actual) / actual) < 0.04
    assert np.mean(np.abs(np.array(fc.baseline) - actual) / actual) > 0.08


@pytest.mark.parametrize(
    "bad",
    [[], [1.0, -1.0], [1.0, float("nan")], [float("inf")]],
    ids=["empty", "negative", "nan", "infinite"],
)
def test_bad_history_is_refused(bad: list[float]) -> None:
    with pytest.raises(ValueError, match="history"):
        forecast_demand(bad, 5)


def test_metrics_on_hand_worked_numbers() -> None:
    # train 0..9: seasonal (7) naive in-sample error |y_t - y_{t-7}| = 7 on every day.
    # errors 0, 0, 1 -> MAE 1/3, MASE (1/3)/7; sMAPE mean(0, 0, 1/7); 2 of 3 inside the band.
    got = accuracy(
        train=list(range(10)),
        actual=[1.0, 2.0, 3.0],
        p50=[1.0, 2.0, 4.0],
        p10=[0.0, 0.0, 3.5],
        p90=[5.0, 5.0, 5.0],
    )
    assert got.mae == pytest.approx(1 / 3)
    assert got.mase == pytest.approx(1 / 21)
    assert got.smape == pytest.approx(1 / 21)
    assert got.coverage == pytest.approx(2 / 3)


def test_backtest_knows_the_baseline_answer_on_a_noiseless_series() -> None:
    # Linear growth of 2/day times the weekday factor. Seasonal naive k days ahead is short by
    # 2 * 7 * ceil(k / 7) * factor; the in-sample scale is 2 * 7 * factor over whole weeks. So
    # with a 14-day horizon and whole weeks, its MASE is mean(ceil(k / 7), k = 1..14) = 1.5.
    history = linear_weekly(21 * 7)
    result = backtest(history, 14, weekly_origins(len(history), 14, 3))
    assert result.origins == (119, 126, 133)
    assert result.baseline.mase == pytest.approx(1.5)
    assert result.forecast.mase < 0.3
    assert result.relative_mae < 0.2
    assert result.horizon_days == 14


def test_weekly_origins_refuse_a_history_too_short() -> None:
    with pytest.raises(ValueError, match="cannot hold"):
        weekly_origins(40, 30, 3)


def test_daily_origins_end_a_horizon_before_the_last_day() -> None:
    # 33 days, 7 ahead: the last origin fits 26 days; 13 a day apart reach back to 14.
    assert rolling_origins(33, 7, 13, 1) == tuple(range(14, 27))
    with pytest.raises(ValueError, match="cannot hold"):
        rolling_origins(33, 7, 14, 1)  # origin 13 would leave under two weeks to fit


def test_a_training_window_scales_mase_by_the_days_fitted_on() -> None:
    # 70 flat days (the weekly shape around 100), then growth of 2/day. A 49-day window from
    # origins 119..133 holds growth alone in its in-sample pairs (days 77.. against 70..): seasonal
    # naive's MASE is 1.5 as on a wholly linear series (test above). Fitted on every day, the
    # flat weeks' zero in-sample error shrinks the scale to about 45/112 of it, and the same
    # out-of-sample errors score worse.
    t = np.arange(21 * 7)
    history = (100.0 + 2.0 * np.maximum(t - 70, 0)) * WEEK[t % 7]
    origins = weekly_origins(len(history), 14, 3)
    windowed = backtest(history, 14, origins, window=49)
    everything = backtest(history, 14, origins)
    assert windowed.baseline.mase == pytest.approx(1.5)
    assert everything.baseline.mase > 1.5 * 2
    with pytest.raises(ValueError, match="window"):
        backtest(history, 14, origins, window=7)


class _Constant:
    """A fitted model that forecasts `value` every day, a band of +-1 around it."""

    def __init__(self, value: float) -> None:
        self.value = value

    def forecast(self, *, y: np.ndarray, h: int, level: list[int]) -> dict[str, np.ndarray]:
        mean = np.full(h, self.value)
        return {"mean": mean, "lo-80": mean - 1, "hi-80": mean + 1}


def _constant(name: str, value: float) -> Candidate:
    return Candidate(name, name, lambda: _Constant(value), log=False)


def test_the_choice_is_the_least_inner_error_and_never_a_diverged_fit() -> None:
    # The last days of the history are near 50: the candidate forecasting 50 errs least on
    # them; one forecasting NaN is never taken, even listed first.
    history = np.full(42, 50.0)
    pool = (_constant("nan", float("nan")), _constant("ten", 10.0), _constant("fifty", 50.0))
    assert choose(history, 30, pool).name == "fifty"


def test_a_history_too_short_to_compare_gets_the_first_candidate() -> None:
    # 20 days: the inner horizon is a week, the inner origins 6 and 13 fit under two weeks.
    assert inner_split(20, 30) == (7, ())
    pool = (_constant("first", 1.0), _constant("better", 5.0))
    assert choose(np.full(20, 5.0), 30, pool).name == "first"


def test_the_forecast_names_the_candidate_it_fitted() -> None:
    fc = forecast_demand(linear_weekly(140), 28)
    names = [c.name for c in CANDIDATES]
    assert fc.method.split(",")[0] in names
    # One candidate alone is fitted as it is (the benchmark measures each so).
    alone = forecast_demand(linear_weekly(140), 28, CANDIDATES[3:])
    assert alone.method.startswith("AutoTheta on log1p(demand)")


def test_a_longer_fit_horizon_scores_the_first_days_of_the_longer_forecast() -> None:
    # The product reads 14 days off a longer forecast: the baseline's first 14 days are the
    # same either way (seasonal naive repeats the last week), so its scores are too.
    history = linear_weekly(21 * 7)
    origins = weekly_origins(len(history), 14, 3)
    short = backtest(history, 14, origins)
    read_off = backtest(history, 14, origins, fit_horizon=28)
    assert read_off.baseline.mase == pytest.approx(short.baseline.mase) == pytest.approx(1.5)
    assert read_off.horizon_days == 14
    assert read_off.forecast.mase < 0.3
