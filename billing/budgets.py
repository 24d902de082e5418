"""Budgets: a tenant's month in money or GPU-hours, what its subtree spent and committed.

- Spend is what metering charged the subtree's jobs in the month (`BudgetSpend`, one row
  per tenant and month, added to by metering in the same transaction as the hour's usage
  records: `spend_add`), so a position is a sum over the subtree's rows, not a re-rating.
- Committed is what admitted jobs may still cost: each admitted job's reservation
  (billing/reservations.py) less what it has been metered for since, never below zero.
- A budget applies to its tenant's whole subtree, so a job counts against its tenant's
  budget and every ancestor's.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from dataclasses import dataclass
from datetime import UTC, datetime
from decimal import ROUND_HALF_EVEN, Decimal
from fractions import Fraction
from typing import Any

from django.conf import settings
from django.db import IntegrityError, transaction
from django.db.models import DecimalField, F, Sum, Value
from django.db.models.functions import Greatest

from billing import rating
from billing.models import Budget, BudgetReservation, BudgetSpend, BudgetUnit
from scheduler.models import FINAL_STATES
from tenants.models import Tenant

logger = logging.getLogger(__name__)

CENT = Decimal("0.01")
TENTH = Decimal("0.1")
EXACT = Decimal("0.000001")
ZERO = Decimal(0)
THRESHOLDS = (50, 80, 100)


def month_start(at: datetime) -> datetime:
    """The first instant (UTC) of the month `at` falls in."""
    return at.astimezone(UTC).replace(day=1, hour=0, minute=0, second=0, microsecond=0)


def month_end(month: datetime) -> datetime:
    return month.replace(year=month.year + month.month // 12, month=month.month % 12 + 1)


@dataclass(frozen=True)
class BudgetPosition:
    """Where a budget stands. Figures are in the budget's unit (money in the installation's
    currency, or GPU-hours), to two places; `percent` is (spent + committed) / limit, to a
    tenth (100 for a zero budget: nothing may be spent). `remaining` may be negative."""

    budget_id: int
    tenant_id: int
    month: datetime
    unit: str
    limit: Decimal
    spent: Decimal
    committed: Decimal
    remaining: Decimal
    percent: Decimal
    policy: str
    currency: str

    def as_json(self) -> dict[str, Any]:
        return {
            "unit": self.unit,
            "currency": self.currency if self.unit == BudgetUnit.MONEY else None,
            "month": self.month.strftime("%Y-%m"),
            "limit": f"{self.limit:f}",
            "spent": f"{self.spent:f}",
            "committed": f"{self.committed:f}",
            "remaining": f"{self.remaining:f}",
            "percent": f"{self.percent:f}",
            "policy": self.policy,
        }

    @property
    def percent_text(self) -> str:
        """'112' for 112.0, '106.7' otherwise."""
        return f"{self.percent.normalize():f}"

    def figure(self, value: Decimal) -> str:
        """`value` in the budget's unit for people: 'EUR 1,120.00' or '12.50 GPU-hours'."""
        if self.unit == BudgetUnit.MONEY:
            return f"{self.currency} {value:,.2f}"
        return f"{value:,.2f} GPU-hours"


def percent_of(used: Decimal, limit: Decimal) -> Decimal:
    if limit <= 0:
        return Decimal(100)
    return (used * 100 / limit).quantize(TENTH, rounding=ROUND_HALF_EVEN)


def subtree_spent(tenant: Tenant, month: datetime, unit: str) -> Decimal:
    field = "gpu_hours" if unit == BudgetUnit.GPU_HOURS else "amount"
    total = BudgetSpend.objects.filter(tenant__path__startswith=tenant.path, month=month).aggregate(
        total=Sum(field)
    )["total"]
    return Decimal(total or 0)


def subtree_committed(tenant: Tenant, month: datetime, unit: str) -> Decimal:
    """What the subtree's open reservations may still cost. A reservation made before the
    month ends counts while its job is not final, whatever month it was made in: what a
    running job may still cost is spent from now on."""
    held, metered = (
        ("gpu_hours", "metered_gpu_hours")
        if unit == BudgetUnit.GPU_HOURS
        else ("amount", "metered")
    )
    total = (
        BudgetReservation.objects.filter(
            tenant__path__startswith=tenant.path,
            released_at__isnull=True,
            created_at__lt=month_end(month),
        )
        .exclude(job__state__in=FINAL_STATES)
        .aggregate(total=_still(held, metered))["total"]
    )
    return Decimal(total or 0)


def _still(held: str, metered: str) -> Sum:
    """What open reservations may still cost: each max(0, reserved - metered), summed."""
    decimal = DecimalField(max_digits=20, decimal_places=6)
    return Sum(Greatest(F(held) - F(metered), Value(ZERO), output_field=decimal))


def position_of(budget: Budget, *, extra: Decimal = ZERO) -> BudgetPosition:
    """`budget`'s position; `extra` (a job's projected cost) is counted as committed."""
    tenant = budget.tenant
    spent = subtree_spent(tenant, budget.month, budget.unit)
    committed = subtree_committed(tenant, budget.month, budget.unit) + extra
    return _position(budget, spent, committed)


def positions_of(budgets: list[Budget]) -> dict[int, BudgetPosition]:
    """The positions of a page of budgets, in a few queries per distinct month of the page
    (not per budget): each tenant's own spend and open reservations are read once, then
    summed over each budget's subtree."""
    out: dict[int, BudgetPosition] = {}
    for month in {b.month for b in budgets}:
        these = [b for b in budgets if b.month == month]
        spend = list(
            BudgetSpend.objects.filter(month=month).values_list(
                "tenant__path", "amount", "gpu_hours"
            )
        )
        held = list(
            BudgetReservation.objects.filter(
                released_at__isnull=True, created_at__lt=month_end(month)
            )
            .exclude(job__state__in=FINAL_STATES)
            .values("tenant__path")
            .annotate(
                money=_still("amount", "metered"), gpu=_still("gpu_hours", "metered_gpu_hours")
            )
            .values_list("tenant__path", "money", "gpu")
        )
        for budget in these:
            path = budget.tenant.path
            column = 2 if budget.unit == BudgetUnit.GPU_HOURS else 1
            spent = sum((Decimal(r[column]) for r in spend if r[0].startswith(path)), ZERO)
            committed = sum((Decimal(r[column]) for r in held if r[0].startswith(path)), ZERO)
            out[budget.pk] = _position(budget, spent, committed)
    return out


def _position(budget: Budget, spent: Decimal, committed: Decimal) -> BudgetPosition:
    spent = spent.quantize(CENT, ROUND_HALF_EVEN)
    committed = committed.quantize(CENT, ROUND_HALF_EVEN)
    return BudgetPosition(
        budget_id=budget.pk,
        tenant_id=budget.tenant_id,
        month=budget.month,
        unit=budget.unit,
        limit=budget.limit,
        spent=spent,
        committed=committed,
        remaining=budget.limit - spent - committed,
        percent=percent_of(spent + committed, budget.limit),
        policy=budget.policy,
        currency=settings.GANTRY_BILLING_CURRENCY,
    )


def budget_position(tenant: Tenant, at: datetime) -> BudgetPosition | None:
    """The position of `tenant`'s budget for the month of `at`; None when it has none.
    Three queries, whatever the size of the subtree's month."""
    budget = (
        Budget.objects.filter(tenant=tenant, month=month_start(at)).select_related("tenant").first()
    )
    return None if budget is None else position_of(budget)


def budgets_over(tenant: Tenant, at: datetime) -> list[Budget]:
    """The budgets of the month of `at` that a job of `tenant` counts against: its own and
    its ancestors', root first."""
    ids = tenant.ancestor_ids()
    found = Budget.objects.filter(tenant_id__in=ids, month=month_start(at)).select_related("tenant")
    return sorted(found, key=lambda b: ids.index(b.tenant_id))


# --- spend, from metering ---------------------------------------------------------------


def spend_metered(period: Any, records: list[Any]) -> None:
    """Metering's hook, after an hour's usage records are written (same transaction): add
    them to the spend, and check the alerts of the budgets they moved once committed."""
    from billing.statements import rates_between

    month = month_start(period.start)
    added = spend_add(records, rates_between(period.start, period.end), month)
    if added:
        tenants = sorted(added)
        transaction.on_commit(lambda: alerts_check_later(tenants, month))


def alerts_check_later(tenant_ids: list[int], month: datetime) -> None:
    """Queue the alert check of the budgets over `tenant_ids` (theirs and their ancestors').
    A broker that is down costs a log line: the next check (an hour later) catches up."""
    from billing.tasks import budget_alerts_check  # tasks import this module

    try:
        budget_alerts_check.delay(tenant_ids, month.isoformat())
    except Exception:  # any broker error
        logger.warning("could not queue the budget alert check", exc_info=True)


def spend_add(records: list[Any], rates: list[rating.Rate], month: datetime) -> dict[int, Any]:
    """Add the hour's usage `records` (UsageRecord rows of one hour) to their tenants' spend
    and to their jobs' open reservations. Runs inside metering's transaction, so the hour's
    records and their spend are written together or not at all.

    Returns {tenant id: (money, GPU-hours)} added. A flavor without a rate for the hour adds
    its GPU-hours and no money (a statement of it would refuse the period until one is set).
    """
    by_tenant: dict[int, list[Fraction]] = defaultdict(lambda: [Fraction(0), Fraction(0)])
    by_job: dict[int, list[Fraction]] = defaultdict(lambda: [Fraction(0), Fraction(0)])
    for record, money, gpu_hours in _priced(records, rates):
        for totals in (by_tenant[record.tenant_id], by_job[record.allocation.job_id]):
            totals[0] += money
            totals[1] += gpu_hours
    for tenant_id, (money, gpu_hours) in by_tenant.items():
        _spend_row_add(tenant_id, month, _exact(money), _exact(gpu_hours))
    _reservations_metered(by_job)
    return by_tenant


def _exact(value: Fraction) -> Decimal:
    return (Decimal(value.numerator) / Decimal(value.denominator)).quantize(EXACT, ROUND_HALF_EVEN)


def _priced(records: list[Any], rates: list[rating.Rate]) -> list[tuple[Any, Fraction, Fraction]]:
    """(record, money, GPU-hours) of one hour's records, exact. Rates change on the hour
    (billing/rates.py), so one version per flavor prices the whole hour, as rating would."""
    if not records:
        return []
    hour = min(r.start for r in records)
    in_force = {rate.flavor: rate for rate in rates if rate.covers(hour)}
    out = []
    for record in records:
        usage = rating.Usage(
            record.tenant_id,
            record.flavor,
            "used",
            record.start,
            record.end,
            record.gpu_milli,
            record.cpu_milli,
            record.memory_mib,
        )
        held = rating.held(usage)
        rate = in_force.get(record.flavor)
        money = Fraction(0)
        if rate is not None:
            for resource, amount in held.items():
                price = rate.unit_price(resource, record.priority_class, record.borrowed)
                money += Fraction(price) * amount / rating.UNITS[resource][1]
        out.append((record, money, held["gpu"] / rating.UNITS["gpu"][1]))
    return out


def _spend_row_add(tenant_id: int, month: datetime, money: Decimal, gpu_hours: Decimal) -> None:
    rows = BudgetSpend.objects.filter(tenant_id=tenant_id, month=month)
    if rows.update(amount=F("amount") + money, gpu_hours=F("gpu_hours") + gpu_hours):
        return
    try:
        with transaction.atomic():
            BudgetSpend.objects.create(
                tenant_id=tenant_id, month=month, amount=money, gpu_hours=gpu_hours
            )
    except IntegrityError:
        # A concurrent run metering another hour of the month created it meanwhile.
        rows.update(amount=F("amount") + money, gpu_hours=F("gpu_hours") + gpu_hours)


def _reservations_metered(by_job: dict[int, list[Fraction]]) -> None:
    held = list(
        BudgetReservation.objects.select_for_update().filter(
            job_id__in=list(by_job), released_at__isnull=True
        )
    )
    for reservation in held:
        money, gpu_hours = by_job[reservation.job_id]
        reservation.metered += _exact(money)
        reservation.metered_gpu_hours += _exact(gpu_hours)
    BudgetReservation.objects.bulk_update(held, ["metered", "metered_gpu_hours"])
