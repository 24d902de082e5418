"""capacity.tco: owning against renting, each figure with the inputs that explain it."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from capacity.tco import (
    MONTH_HOURS,
    Costs,
    break_even_month,
    break_even_utilization,
    chargeback_rate,
    option_months,
)

pytestmark = pytest.mark.backend_independent(
    "pure TCO arithmetic (import-linter): no database, cache or broker"
)


def costs(**overrides: float) -> Costs:
    values = {
        "purchase_price": 24_000.0,
        "depreciation_months": 36,
        "power_cooling_per_gpu_hour": 0.2,
        "hosting_support_per_month": 100.0,
        "on_demand_per_gpu_hour": 2.5,
        "committed_per_gpu_hour": 1.8,
    }
    values.update(overrides)
    return Costs(**values)  # type: ignore[arg-type]


def test_the_break_even_utilization_by_hand() -> None:
    # fixed = 24000 / 36 + 100 = 766.67 a month; 766.67 / (720 x (2.5 - 0.2)) = 46.3%.
    got = break_even_utilization(costs())
    assert got.value == pytest.approx(766.6667 / (720 * 2.3), rel=1e-6)
    assert "46.3%" in got.explain
    assert got.inputs["fixed_per_month"] == pytest.approx(766.6667, rel=1e-6)


def test_owning_never_pays_when_renting_costs_no_more_than_power() -> None:
    assert break_even_utilization(costs(on_demand_per_gpu_hour=0.2)).value is None
    # fixed 766.67 a month against a margin of 0.3 an hour: 355% would be needed.
    assert break_even_utilization(costs(on_demand_per_gpu_hour=0.5)).value is None


def test_the_chargeback_rate_by_hand() -> None:
    # 766.67 / (720 x 0.8) + 0.2 = 1.5310 per GPU-hour.
    got = chargeback_rate(costs(), 0.8, "EUR")
    assert got.value == pytest.approx(766.6667 / 576 + 0.2, rel=1e-6)
    assert "1.5310 EUR per GPU-hour" in got.explain


def test_the_break_even_month_by_hand() -> None:
    # 1 GPU used every hour: renting costs 720 a month; owning 1000 upfront and nothing
    # after: month 1 rent 720 < 1000, month 2 rent 1440 >= 1000.
    c = costs(purchase_price=1000, depreciation_months=10, power_cooling_per_gpu_hour=0,
              hosting_support_per_month=0, on_demand_per_gpu_hour=1)  # fmt: skip
    months = option_months(c, 1, [24.0] * 90)
    assert [m.gpu_hours for m in months] == [720, 720, 720]
    assert break_even_month(c, 1, months).value == 2
    assert break_even_month(c, 1, months[:1]).value is None


money = st.floats(0, 1e5, allow_nan=False)
rate = st.floats(0.01, 100, allow_nan=False)


@settings(max_examples=200)
@given(purchase=money, months=st.integers(1, 120), power=rate, hosting=money, on_demand=rate)
def test_at_the_break_even_utilization_owning_and_renting_cost_the_same(
    purchase, months, power, hosting, on_demand
) -> None:
    c = costs(purchase_price=purchase, depreciation_months=months,
              power_cooling_per_gpu_hour=power, hosting_support_per_month=hosting,
              on_demand_per_gpu_hour=on_demand)  # fmt: skip
    u = break_even_utilization(c).value
    if u is None:
        # Owning costs more than renting even at full use.
        assert c.fixed_per_month + power * MONTH_HOURS >= on_demand * MONTH_HOURS - 1e-6
        return
    own = c.fixed_per_month + power * MONTH_HOURS * u
    rent = on_demand * MONTH_HOURS * u
    assert own == pytest.approx(rent, rel=1e-9, abs=1e-6)


@settings(max_examples=200)
@given(purchase=money, months=st.integers(1, 120), power=rate, hosting=money,
       target=st.floats(0.01, 1))  # fmt: skip
def test_the_chargeback_rate_recovers_the_cost_at_the_target(
    purchase, months, power, hosting, target
) -> None:
    c = costs(purchase_price=purchase, depreciation_months=months,
              power_cooling_per_gpu_hour=power, hosting_support_per_month=hosting)  # fmt: skip
    rate_ = chargeback_rate(c, target).value
    assert rate_ is not None
    hours = MONTH_HOURS * target
    assert rate_ * hours == pytest.approx(c.fixed_per_month + power * hours, rel=1e-9)


@given(gpus=st.integers(0, 64), demand=st.lists(st.floats(0, 5000), min_size=30, max_size=120))
def test_an_option_serves_no_more_than_its_gpus(gpus, demand) -> None:
    months = option_months(costs(), gpus, demand)
    assert len(months) == len(demand) // 30
    for m in months:
        assert 0 <= m.gpu_hours <= gpus * MONTH_HOURS + 1e-6
        assert m.committed == pytest.approx(1.8 * gpus * MONTH_HOURS)


def test_bad_costs_are_refused() -> None:
    with pytest.raises(ValueError):
        costs(depreciation_months=0)
    with pytest.raises(ValueError):
        costs(purchase_price=-1)
