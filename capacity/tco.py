"""Owning against renting a GPU model. Pure: plain numbers in, figures that explain themselves
out (every `Figure` carries its inputs and an `explain` text a reader can check by hand).

A month here is 30 days (720 hours): the forecast's days are cut into such months from its
first day, and the steady-state figures use the same month.

Owning one GPU a month costs fixed = purchase / depreciation months + hosting and support,
plus power and cooling for each hour it is used. Renting on demand costs the on-demand price for
each hour used; committed rental costs the committed price for every hour, used or not.
- break-even utilization: where owning and renting on demand cost the same,
  u = fixed / (720 * (on_demand - power)): above it owning is cheaper (never, when renting
  costs no more than the power).
- chargeback rate: the price per used GPU-hour that recovers owning at a target utilization,
  fixed / (720 * target) + power.
- break-even month: the first month whose cumulative cost of owning (the purchase paid
  upfront) is at most that of renting the same demand on demand.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

MONTH_DAYS = 30
MONTH_HOURS = 24 * MONTH_DAYS


@dataclass(frozen=True)
class Costs:
    """One GPU of a model, in the installation's currency."""

    purchase_price: float
    depreciation_months: int
    power_cooling_per_gpu_hour: float
    hosting_support_per_month: float
    on_demand_per_gpu_hour: float
    committed_per_gpu_hour: float

    def __post_init__(self) -> None:
        if (
            self.depreciation_months < 1
            or min(
                self.purchase_price,
                self.power_cooling_per_gpu_hour,
                self.hosting_support_per_month,
                self.on_demand_per_gpu_hour,
                self.committed_per_gpu_hour,
            )
            < 0
        ):
            raise ValueError("costs must be >= 0 and depreciation at least one month")

    @property
    def fixed_per_month(self) -> float:
        return self.purchase_price / self.depreciation_months + self.hosting_support_per_month


@dataclass(frozen=True)
class Figure:
    value: float | None  # None: never (no break-even)
    explain: str
    inputs: dict[str, float] = field(default_factory=dict)


def _money(value: float, currency: str) -> str:
    return f"{value:,.2f} {currency}"


def break_even_utilization(c: Costs) -> Figure:
    margin = c.on_demand_per_gpu_hour - c.power_cooling_per_gpu_hour
    inputs = {
        "fixed_per_month": c.fixed_per_month,
        "on_demand": c.on_demand_per_gpu_hour,
        "power_cooling": c.power_cooling_per_gpu_hour,
    }
    if margin <= 0:
        return Figure(
            None, "renting costs no more than the power of owning: owning never pays", inputs
        )
    u = c.fixed_per_month / (MONTH_HOURS * margin)
    return Figure(
        u if u <= 1 else None,
        f"fixed {c.fixed_per_month:,.2f} a month / ({MONTH_HOURS} h x (on-demand "
        f"{c.on_demand_per_gpu_hour:,.4f} - power {c.power_cooling_per_gpu_hour:,.4f})) = {u:.1%}"
        + ("" if u <= 1 else ": above 100%, owning never pays"),
        inputs,
    )


def chargeback_rate(c: Costs, target: float, currency: str = "") -> Figure:
    if not 0 < target <= 1:
        raise ValueError("the target utilization must be in (0, 1]")
    rate = c.fixed_per_month / (MONTH_HOURS * target) + c.power_cooling_per_gpu_hour
    return Figure(
        rate,
        f"fixed {_money(c.fixed_per_month, currency)} a month / ({MONTH_HOURS} h x {target:.0%}"
        f" used) + power {c.power_cooling_per_gpu_hour:,.4f} = {rate:,.4f} {currency} per GPU-hour",
        {
            "fixed_per_month": c.fixed_per_month,
            "target": target,
            "power_cooling": c.power_cooling_per_gpu_hour,
        },
    )


@dataclass(frozen=True)
class Month:
    index: int  # 1: the forecast's first 30 days
    gpu_hours: float  # demand the option serves this month
    own: float
    on_demand: float
    committed: float


def monthly_gpu_hours(daily: Sequence[float]) -> list[float]:
    """Whole 30-day months of a daily series (a last partial month is left out)."""
    whole = len(daily) // MONTH_DAYS
    return [sum(daily[m * MONTH_DAYS : (m + 1) * MONTH_DAYS]) for m in range(whole)]


def option_months(c: Costs, gpus: int, daily_demand: Sequence[float]) -> list[Month]:
    """Each month's cost of serving `daily_demand` (GPU-hours a day beyond the pool's limit)
    with `gpus` more GPUs: owned, rented on demand, or committed. Demand past what `gpus` can
    serve (gpus x 24 a day) is left out of all three alike."""
    if gpus < 0:
        raise ValueError("gpus must be >= 0")
    served = [min(max(d, 0.0), gpus * 24.0) for d in daily_demand]
    return [
        Month(
            index=m + 1,
            gpu_hours=hours,
            own=gpus * c.fixed_per_month + c.power_cooling_per_gpu_hour * hours,
            on_demand=c.on_demand_per_gpu_hour * hours,
            committed=c.committed_per_gpu_hour * gpus * MONTH_HOURS,
        )
        for m, hours in enumerate(monthly_gpu_hours(served))
    ]


def break_even_month(c: Costs, gpus: int, months: Sequence[Month]) -> Figure:
    """The first month the cumulative cost of owning (purchase upfront, then hosting and
    power) is at most renting on demand; None within the months given."""
    own = gpus * c.purchase_price
    rent = 0.0
    for month in months:
        own += gpus * c.hosting_support_per_month + c.power_cooling_per_gpu_hour * month.gpu_hours
        rent += month.on_demand
        if own <= rent:
            return Figure(
                month.index,
                f"by month {month.index}: owning {own:,.2f} (purchase {gpus} x "
                f"{c.purchase_price:,.2f} upfront) <= renting on demand {rent:,.2f}",
                {"own": own, "rent": rent, "gpus": gpus},
            )
    return Figure(
        None,
        f"not within {len(months)} months: owning {own:,.2f} against renting {rent:,.2f}",
        {"own": own, "rent": rent, "gpus": gpus},
    )
