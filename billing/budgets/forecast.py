"""Spend to date, committed and a forecast to the month's end, for a tenant's subtree (the
tenant page; issue 18, "Spend, committed, forecast").

- Spend to date: what metering charged the subtree's jobs this month (the budgets' spend
  rows, `budgets.subtree_spent`: a sum over the subtree's rows, never a re-rating).
- Committed: what the subtree's admitted jobs may still cost (their reservations less what
  they were metered for since: `budgets.subtree_committed`).
- Forecast: spend to date + the burn rate x the hours left in the month after the last
  metered hour. The burn rate is the subtree's spend per hour over the last 24 metered
  hours (or as many as were metered), rated from those hours' usage records alone, so a
  page view rates a day, never the month. Until an hour of the month is metered there is
  none: no spend to date to start from, and a burn rate of another month's hours (or of
  none, 0.00 beside jobs running) would mislead; the page says when metering runs next.

All three are the jobs' usage, in the installation's currency: idle reserved capacity and
adjustments, which only statements carry, are left out (as in budgets).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from decimal import ROUND_HALF_EVEN, Decimal
from fractions import Fraction
from typing import Any

from django.conf import settings
from django.utils import timezone

from billing.budgets.spend import subtree_committed, subtree_spent
from billing.metering.schedule import metering_times
from billing.models import BudgetUnit, MeteringPeriod, UsageRecord
from billing.periods import month_end, month_start
from billing.rates import rating
from billing.statements.rollup import rates_between
from tenants import access
from tenants.models import Role, Tenant

CENT = Decimal("0.01")
BURN_HOURS = 24
SECONDS_PER_HOUR = Decimal(3600)

# The page passes no time: tests replace this clock.
clock: Callable[[], datetime] = timezone.now


@dataclass(frozen=True)
class SpendForecast:
    month: datetime
    currency: str
    spent: Decimal
    committed: Decimal
    burn_per_hour: Decimal  # over `burn_hours` metered hours ending at `metered_until`
    burn_hours: int
    metered_until: datetime | None  # the end of the last metered hour; None: nothing yet
    hours_left: Decimal  # from max(metered_until, the month's start) to the month's end
    forecast: Decimal | None  # None until an hour of the month is metered
    next_metering: datetime  # when metering runs next (billing/metering/schedule.py)


def tenant_cost_scope(user: Any, tenant: Tenant) -> str | None:
    """Which of the tenant's figures `user` may see, by billing/selectors.py's rule:
    "subtree" for finance, platform admins and the admins of the tenant (or an ancestor);
    "projects" for a member (or approver) of it, whose teams' projects are all of the
    subtree's projects, so the jobs' figures shown are exactly those of their projects;
    None for anyone else."""
    grants = access.grants_for(user)
    role = grants.role_on(tenant)
    if grants.sees_everything or role == Role.ADMIN:
        return "subtree"
    return "projects" if role is not None else None


def _money(records: list[UsageRecord], rates: list[rating.Rate]) -> Fraction:
    usage = [
        rating.Usage(
            r.tenant_id,
            r.flavor,
            "used",
            r.start,
            r.end,
            r.gpu_milli,
            r.cpu_milli,
            r.memory_mib,
            r.priority_class,
            r.borrowed,
        )
        for r in records
    ]
    try:
        lines = rating.rate_usage(usage, rates)
    except rating.MissingRate:
        # A flavor without a rate for some hour: price what can be priced, one by one.
        lines = []
        for one in usage:
            try:
                lines += rating.rate_usage([one], rates)
            except rating.MissingRate:
                continue
    return sum((Fraction(line.rate) * line.exact for line in lines), Fraction(0))


def _burn(tenant: Tenant, until: datetime) -> tuple[Decimal, int]:
    """(spend per hour, hours metered) over the last BURN_HOURS metered hours to `until`."""
    start = until - timedelta(hours=BURN_HOURS)
    hours = MeteringPeriod.objects.filter(start__gte=start, start__lt=until).count()
    if not hours:
        return Decimal(0), 0
    records = list(
        UsageRecord.objects.filter(
            tenant__path__startswith=tenant.path,
            period__start__gte=start,
            period__start__lt=until,
        ).only(
            "tenant_id",
            "flavor",
            "start",
            "end",
            "gpu_milli",
            "cpu_milli",
            "memory_mib",
            "priority_class",
            "borrowed",
        )
    )
    per_hour = _money(records, rates_between(start, until)) / hours
    return Decimal(per_hour.numerator) / Decimal(per_hour.denominator), hours


def tenant_spend_forecast(tenant: Tenant, *, at: datetime | None = None) -> SpendForecast:
    """The subtree's figures for the month of `at` (now by default), as metered by then."""
    at = at or clock()
    month = month_start(at)
    end = month_end(month)
    spent = subtree_spent(tenant, month, BudgetUnit.MONEY).quantize(CENT, ROUND_HALF_EVEN)
    committed = subtree_committed(tenant, month, BudgetUnit.MONEY)
    last = (
        MeteringPeriod.objects.filter(start__lt=min(at, end))
        .order_by("-start")
        .values_list("end", flat=True)
        .first()
    )
    burn, hours = _burn(tenant, last) if last is not None else (Decimal(0), 0)
    anchor = min(max(last or month, month), end)
    hours_left = Decimal((end - anchor).total_seconds()) / SECONDS_PER_HOUR
    metered = last is not None and last > month  # an hour of this month
    return SpendForecast(
        month=month,
        currency=settings.GANTRY_BILLING_CURRENCY,
        spent=spent,
        committed=committed.quantize(CENT, ROUND_HALF_EVEN),
        burn_per_hour=burn.quantize(CENT, ROUND_HALF_EVEN),
        burn_hours=hours,
        metered_until=last,
        hours_left=hours_left,
        forecast=(spent + burn * hours_left).quantize(CENT, ROUND_HALF_EVEN) if metered else None,
        next_metering=metering_times(at).next_run,
    )
