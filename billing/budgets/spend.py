"""Budgets: a tenant's month in money or GPU-hours, what its subtree spent and committed.

- Spend is what metering charged the subtree's jobs in the month (`BudgetSpend`, one row
  per tenant and month, added to by metering in the same transaction as the hour's usage
  records: `spend_add`, rated per group of records and upserted in one statement), so a
  position is a sum over the subtree's rows, not a re-rating.
- Committed is what admitted jobs may still cost: each admitted job's reservation
  (billing/reservations.py) less what it has been metered for since, never below zero.
- A budget applies to its tenant's whole subtree, so a job counts against its tenant's
  budget and every ancestor's.
"""

from __future__ import annotations

import logging
import math
from collections import defaultdict
from dataclasses import dataclass
from datetime import UTC, datetime
from decimal import ROUND_HALF_EVEN, Decimal
from fractions import Fraction
from functools import partial
from typing import Any

from django.conf import settings
from django.db import connection, transaction
from django.db.models import Count, DecimalField, F, Max, Sum, Value
from django.db.models.functions import Greatest

from billing.models import (
    Budget,
    BudgetReservation,
    BudgetSpend,
    BudgetUnit,
    RateCard,
    UsageRecord,
)
from billing.periods import month_end, month_start
from billing.rates import rating
from scheduler.models import FINAL_STATES
from tenants.models import Tenant

logger = logging.getLogger(__name__)

CENT = Decimal("0.01")
TENTH = Decimal("0.1")
EXACT = Decimal("0.000001")
ZERO = Decimal(0)
THRESHOLDS = (50, 80, 100)


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


EVER = (datetime(1970, 1, 1, tzinfo=UTC), datetime(9999, 1, 1, tzinfo=UTC))


class SpendRun:
    """What the budgets hook keeps over one metering run: the rate cards, read once and
    read again only when a card was added or withdrawn meanwhile (one small query per hour
    checks), and the tenants whose spend moved, whose alert check is queued once, when the
    run ends (`alerts_queue`)."""

    def __init__(self) -> None:
        self._rates: list[rating.Rate] = []
        self._cards: tuple[int, int | None] | None = None
        self.moved: dict[datetime, set[int]] = defaultdict(set)
        # Unit prices of the rates read, per (rate, priority class, borrowed): the same for
        # every hour a version is in force.
        self.prices: Prices = {}

    def rates(self) -> list[rating.Rate]:
        from billing.statements.rollup import rates_between

        cards = RateCard.objects.aggregate(n=Count("id"), last=Max("id"))
        fingerprint = (cards["n"], cards["last"])
        if fingerprint != self._cards:
            # Every version (there are few): one read serves every hour of the run.
            self._rates = rates_between(EVER[0], EVER[1])
            self._cards = fingerprint
            self.prices = {}
        return self._rates

    def alerts_queue(self) -> None:
        """Queue the alert check of the budgets over the tenants whose spend moved, once the
        run's hours are committed (a run that failed in an hour: those committed before it)."""
        transaction.on_commit(self._alerts_check_later)

    def _alerts_check_later(self) -> None:
        # After the hours' own callbacks, which fill `moved` as each commits.
        moved, self.moved = self.moved, defaultdict(set)
        for month, tenants in sorted(moved.items()):
            alerts_check_later(sorted(tenants), month)


def spend_metered(period: Any, records: list[Any], run: SpendRun | None = None) -> None:
    """Metering's hook, after an hour's usage records are written (same transaction): add
    them to the spend. The alert check of the budgets they moved is queued by `run` when
    the metering run ends, or at this hour's commit when there is no run."""
    month = month_start(period.start)
    run_or_hour = run or SpendRun()
    rates = run_or_hour.rates()
    # (flavor, cluster) -> the version of the hour: the cluster's own card, else the default.
    in_force = {
        (flavor, cluster): rating.in_force(rates, flavor, cluster, period.start)
        for flavor, cluster in {(r.flavor, r.cluster) for r in records}
    }
    tenants = sorted(
        spend_add(records, in_force, month, prices=run_or_hour.prices, period_id=period.pk)
    )
    if not tenants:
        return
    if run is None:
        transaction.on_commit(partial(alerts_check_later, tenants, month))
    else:
        # Counted once the hour commits: an hour rolled back moved nothing.
        transaction.on_commit(partial(run.moved[month].update, tenants))


def alerts_check_later(tenant_ids: list[int], month: datetime) -> None:
    """Queue the alert check of the budgets over `tenant_ids` (theirs and their ancestors').
    A broker that is down costs a log line: the next check (an hour later) catches up."""
    from billing.tasks import budget_alerts_check  # tasks import this module

    try:
        budget_alerts_check.delay(tenant_ids, month.isoformat())
    except Exception:  # any broker error
        logger.warning("could not queue the budget alert check", exc_info=True)


# Exact quantities of one group of records: milli-GPU-, millicore- and MiB-microseconds.
Held = list[int]
MICROSECONDS_PER_S = 1_000_000
# The unit prices (GPU, CPU, memory) of a rate for a priority class and borrowing, over one
# common denominator: (numerators, denominator).
ScaledPrices = tuple[tuple[int, ...], int]
Prices = dict[tuple[int, str, bool], ScaledPrices]


def spend_add(
    records: list[Any],
    in_force: dict[tuple[str, str], rating.Rate | None],
    month: datetime,
    *,
    prices: Prices | None = None,
    period_id: int | None = None,
) -> dict[int, Any]:
    """Add the hour's usage `records` (UsageRecord rows of one hour) to their tenants' spend
    and to their jobs' open reservations. Runs inside metering's transaction, so the hour's
    records and their spend are written together or not at all. `in_force`: the rate version
    of each (flavor, cluster) for the hour, the cluster's card or else the default (rates
    change on the hour, billing/rates/cards.py, so one version prices the whole hour, as
    rating would).

    Returns {tenant id: (money, GPU-hours)} added. A flavor without a rate for the hour adds
    its GPU-hours and no money (a statement of it would refuse the period until one is set).
    `prices`: unit prices kept from earlier hours (filled here); `period_id`: the records'
    period, when they are written already (their jobs are then found in the database, one
    parameter instead of one per job).
    """
    if not records:
        return {}
    if period_id is None:
        jobs: Any = {r.allocation.job_id for r in records}
    else:
        jobs = UsageRecord.objects.filter(period_id=period_id).values("allocation__job_id")
    held = list(
        BudgetReservation.objects.select_for_update().filter(
            job_id__in=jobs, released_at__isnull=True
        )
    )
    reserved = {reservation.job_id for reservation in held}
    by_tenant: dict[tuple[Any, ...], Held] = defaultdict(lambda: [0, 0, 0])
    by_job: dict[tuple[Any, ...], Held] = defaultdict(lambda: [0, 0, 0])
    for record in records:
        key = (record.flavor, record.cluster, record.priority_class, record.borrowed)
        us = (record.end - record.start) // rating.MICROSECOND
        quantities = (record.gpu_milli * us, record.cpu_milli * us, record.memory_mib * us)
        groups = [by_tenant[(record.tenant_id, *key)]]
        if record.allocation.job_id in reserved:
            groups.append(by_job[(record.allocation.job_id, *key)])
        for totals in groups:
            for i, quantity in enumerate(quantities):
                totals[i] += quantity
    prices = {} if prices is None else prices
    added = _priced(by_tenant, in_force, prices)
    _spend_rows_add(added, month)
    _reservations_metered(held, _priced(by_job, in_force, prices))
    return added


def _priced(
    groups: dict[tuple[Any, ...], Held],
    in_force: dict[tuple[str, str], rating.Rate | None],
    prices: Prices,
) -> dict[int, tuple[Fraction, Fraction]]:
    """{owner: (money, GPU-hours)}, exact, of groups keyed (owner, flavor, cluster, priority
    class, borrowed): each group is priced once, at its unit prices, which is exactly the sum of its
    records priced one by one. Integer sums over each price's common denominator, one
    fraction per owner and denominator at the end: the same exact sums, with few fractions
    (an hour has hundreds of groups)."""
    money: dict[int, dict[int, int]] = defaultdict(lambda: defaultdict(int))
    gpu: dict[int, int] = defaultdict(int)
    for (owner, flavor, cluster, priority_class, borrowed), quantities in groups.items():
        rate = in_force.get((flavor, cluster))
        key = (id(rate), priority_class, borrowed)
        scaled = prices.get(key)
        if scaled is None:
            scaled = prices[key] = _scaled(_unit_prices(rate, priority_class, borrowed))
        numerators, denominator = scaled
        money[owner][denominator] += sum(n * q for n, q in zip(numerators, quantities, strict=True))
        gpu[owner] += quantities[0]
    gpu_unit = rating.UNITS["gpu"][1] * MICROSECONDS_PER_S
    return {
        owner: (
            sum((Fraction(n, d) for d, n in money[owner].items()), Fraction(0)),
            Fraction(gpu[owner], gpu_unit),
        )
        for owner in gpu
    }


def _scaled(prices: list[Fraction]) -> ScaledPrices:
    denominator = math.lcm(*(price.denominator for price in prices))
    return tuple(p.numerator * (denominator // p.denominator) for p in prices), denominator


def _unit_prices(rate: rating.Rate | None, priority_class: str, borrowed: bool) -> list[Fraction]:
    """The price of one unit of each quantity (GPU, CPU, memory), exact; none without a rate."""
    if rate is None:
        return [Fraction(0)] * len(rating.RESOURCES)
    return [
        Fraction(rate.unit_price(resource, priority_class, borrowed))
        / (rating.UNITS[resource][1] * MICROSECONDS_PER_S)
        for resource in rating.RESOURCES
    ]


def _exact(value: Fraction) -> Decimal:
    return (Decimal(value.numerator) / Decimal(value.denominator)).quantize(EXACT, ROUND_HALF_EVEN)


def _spend_rows_add(added: dict[int, tuple[Fraction, Fraction]], month: datetime) -> None:
    """Add to the tenants' spend rows of `month` in one upsert (PostgreSQL and SQLite share
    the syntax), creating those missing; by tenant id, so concurrent runs metering other
    hours of the month lock the rows in the same order."""
    if not added:
        return
    ops = connection.ops
    table = ops.quote_name(BudgetSpend._meta.db_table)
    when = ops.adapt_datetimefield_value(month)
    params: list[Any] = []
    for tenant_id in sorted(added):
        money, gpu_hours = added[tenant_id]
        params += [tenant_id, when, _exact(money), _exact(gpu_hours)]
    values = ", ".join(["(%s, %s, %s, %s)"] * len(added))
    with connection.cursor() as cursor:
        cursor.execute(
            f"INSERT INTO {table} (tenant_id, month, amount, gpu_hours) VALUES {values} "  # noqa: S608 - names from the model
            f"ON CONFLICT (tenant_id, month) DO UPDATE SET amount = {table}.amount + "
            f"excluded.amount, gpu_hours = {table}.gpu_hours + excluded.gpu_hours",
            params,
        )


def _reservations_metered(
    held: list[BudgetReservation], by_job: dict[int, tuple[Fraction, Fraction]]
) -> None:
    for reservation in held:
        money, gpu_hours = by_job[reservation.job_id]
        reservation.metered += _exact(money)
        reservation.metered_gpu_hours += _exact(gpu_hours)
    BudgetReservation.objects.bulk_update(held, ["metered", "metered_gpu_hours"])
