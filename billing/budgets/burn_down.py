"""Budget burn-down: each budget's spend day by day through its month, against its limit.

The spend is the budgets' own (billing/budgets/spend.py): what metering charged the budget's
subtree, priced per usage record, added up per hour and tenant and kept to 1e-6, so the
last day's figure is the position's `spent` to the cent. Here the same records are read
again and added up per day instead of per month. Days after the last metered hour have no
figure (None): they have not been metered.

Who sees which budgets: those of the tenants whose whole subtree the user sees (finance and
platform admins: all; a tenant admin: their subtrees'), as the costs page's table.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from datetime import date, datetime, timedelta
from decimal import ROUND_HALF_EVEN, Decimal
from fractions import Fraction
from functools import reduce
from operator import or_
from typing import Any

from django.db.models import Q

from billing.budgets.spend import BudgetPosition, positions_of
from billing.models import Budget, BudgetUnit, UsageRecord
from billing.periods import month_end, month_start
from billing.rates import rating
from billing.rates.cards import metered_until
from billing.selectors import organisations_visible, rolled_up_tenants
from billing.statements.rollup import rates_between
from tenants.models import Tenant

CENT = Decimal("0.01")
EXACT = Decimal("0.000001")


@dataclass(frozen=True)
class BurnDown:
    tenant: Tenant
    position: BudgetPosition  # limit, spent, committed, remaining, percent, unit
    days: list[date]  # every day of the month
    spent: list[Decimal | None]  # spent by the end of each day, to the cent; None: not metered

    @property
    def rows(self) -> list[tuple[date, Decimal | None]]:
        return list(zip(self.days, self.spent, strict=True))


def _exact(value: Fraction) -> Decimal:
    return (Decimal(value.numerator) / Decimal(value.denominator)).quantize(EXACT, ROUND_HALF_EVEN)


def _spend_per_day(
    month: datetime, paths: list[str]
) -> dict[tuple[date, str], tuple[Decimal, Decimal]]:
    """(day, tenant path) -> (money, GPU-hours) metered for the tenant's own jobs that day,
    for the tenants under `paths`: per record as budgets price it, per hour and tenant
    kept to 1e-6 as `BudgetSpend` adds it up."""
    end = month_end(month)
    rows = UsageRecord.objects.filter(period__start__gte=month, period__start__lt=end)
    rows = rows.filter(reduce(or_, (Q(tenant__path__startswith=path) for path in paths)))
    rates = rates_between(month, end)
    per_hour: dict[tuple[datetime, str], list[Fraction]] = defaultdict(
        lambda: [Fraction(0), Fraction(0)]
    )
    for row in rows.values_list(
        "period__start",
        "tenant__path",
        "flavor",
        "start",
        "end",
        "gpu_milli",
        "cpu_milli",
        "memory_mib",
        "priority_class",
        "borrowed",
    ):
        hour, path = row[0], row[1]
        usage = rating.Usage(path, row[2], "used", *row[3:8], row[8], row[9])
        try:
            lines = rating.rate_usage([usage], rates)
        except rating.MissingRate:  # as budgets: GPU-hours, no money, until a rate is set
            lines = []
        totals = per_hour[(hour, path)]
        totals[0] += sum((Fraction(line.rate) * line.exact for line in lines), Fraction(0))
        totals[1] += rating.held(usage)["gpu"] / rating.UNITS["gpu"][1]
    out: dict[tuple[date, str], tuple[Decimal, Decimal]] = {}
    for (hour, path), (money, gpu_hours) in per_hour.items():
        money_so_far, hours_so_far = out.get((hour.date(), path), (Decimal(0), Decimal(0)))
        out[(hour.date(), path)] = (money_so_far + _exact(money), hours_so_far + _exact(gpu_hours))
    return out


def budgets_visible(user: Any, month: datetime, top: Tenant | None = None) -> list[Budget]:
    tenants = {
        t.pk
        for organisation in organisations_visible(user)
        for t in rolled_up_tenants(user, organisation)
        if top is None or t.path.startswith(top.path)
    }
    found = Budget.objects.filter(month=month_start(month), tenant_id__in=tenants)
    return sorted(found.select_related("tenant"), key=lambda b: b.tenant.path)


def burn_downs(user: Any, month: datetime, top: Tenant | None = None) -> list[BurnDown]:
    """The burn-down of every budget of `month` the user may see (under `top`)."""
    month = month_start(month)
    budgets = budgets_visible(user, month, top)
    if not budgets:
        return []
    positions = positions_of(budgets)
    spend = _spend_per_day(month, [b.tenant.path for b in budgets])
    until = metered_until()
    starts = []
    day = month
    while day < month_end(month):
        starts.append(day)
        day += timedelta(days=1)
    days = [start.date() for start in starts]
    out = []
    for budget in budgets:
        column = 1 if budget.unit == BudgetUnit.GPU_HOURS else 0
        so_far, spent = Decimal(0), []
        for day_start in starts:
            so_far += sum(
                (
                    figures[column]
                    for (when, path), figures in spend.items()
                    if when == day_start.date() and path.startswith(budget.tenant.path)
                ),
                Decimal(0),
            )
            metered = until is not None and until > day_start  # some of the day is
            spent.append(so_far.quantize(CENT, ROUND_HALF_EVEN) if metered else None)
        out.append(BurnDown(budget.tenant, positions[budget.pk], days, spent))
    return out
