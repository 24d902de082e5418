"""What one job has cost so far, for its page.

- Metered: the job's usage records rated like statements (billing/rates/rating.py): one line per
  flavor, resource, kind (used, preempted, failed) and unit price, each rounded once,
  half-to-even. A statement adds up the lines of a whole account (tenant, project, user), so
  the job's own lines can differ from its share of a statement line by rounding, a cent each
  at most.
- Not metered yet: the time its allocations held devices after the last metered hour
  (`rates.metered_until`), up to `now`, priced at the rates in force at `now`: an estimate,
  labelled as one, until metering prices those hours for good.

Who may see it is who may see the job (`scheduler.jobs.selectors.access_job`): the caller checks.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any

from django.conf import settings
from django.db.models import Q, Sum

from billing.metering.attempts import UsageKind, attempt_kinds
from billing.models import UsageRecord
from billing.rates import rating
from billing.rates.cards import metered_until
from billing.statements.rollup import rates_between
from scheduler.models import Allocation

ZERO = Decimal("0.00")


@dataclass(frozen=True)
class JobCost:
    currency: str
    lines: list[rating.Line]  # metered, with a quantity
    metered: Decimal
    metered_until: datetime | None  # the end of the last metered hour
    estimate: Decimal | None  # the time after it, at the rates in force now; None: no such time
    estimate_hours: Decimal  # GPU-hours of that time (device shares)
    problem: str = ""  # why a part could not be priced (a flavor without a rate card)

    @property
    def total(self) -> Decimal:
        return self.metered + (self.estimate or ZERO)


def _metered(job: Any) -> list[rating.Line]:
    rows = list(
        UsageRecord.objects.filter(allocation__job=job).values_list(
            "allocation_id",
            "allocation__started_at",
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
    if not rows:
        return []
    kinds = attempt_kinds((r[0], job.pk, r[1]) for r in rows)
    usages = [rating.Usage(job.pk, r[2], kinds[r[0]], *r[3:8], r[8], r[9]) for r in rows]
    rates = rates_between(min(r[3] for r in rows), max(r[4] for r in rows))
    return rating.rate_usage(usages, rates)


def _unmetered(job: Any, since: datetime | None, now: datetime) -> list[rating.Usage]:
    """What the job's allocations held after `since` (the end of the last metered hour)."""
    allocations = (
        Allocation.objects.filter(job=job, started_at__lt=now)
        .filter(Q(ended_at__isnull=True) | Q(ended_at__gt=since) if since else Q())
        .annotate(device_milli=Sum("devices__milli"))
        .order_by("id")
    )
    usages = []
    for allocation in allocations:
        start = max(allocation.started_at, since) if since else allocation.started_at
        end = min(allocation.ended_at or now, now)
        if end > start:
            usages.append(
                rating.Usage(
                    job.pk,
                    allocation.flavor,
                    UsageKind.USED,
                    start,
                    end,
                    allocation.device_milli or 0,
                    job.cpu_milli,
                    job.memory_mib,
                    job.priority_class.name,
                    not job.priority_class.counts_against_quota,
                )
            )
    return usages


def _at_todays_rates(usages: list[rating.Usage], now: datetime) -> list[rating.Line]:
    """`usages` priced at the versions in force at `now`, over their whole time."""
    always = datetime(1970, 1, 1, tzinfo=UTC)
    current = [
        replace(rate, valid_from=always, valid_to=None)
        for rate in rates_between(now, now + timedelta(microseconds=1))
    ]
    return rating.rate_usage(usages, current)


def job_cost_so_far(job: Any, *, now: datetime) -> JobCost:
    currency = settings.GANTRY_BILLING_CURRENCY
    problems = []
    try:
        lines = [line for line in _metered(job) if line.exact]
    except rating.MissingRate as missing:
        lines = []
        problems.append(f"The metered hours cannot be priced: {missing}.")
    since = metered_until()
    usages = _unmetered(job, since, now)
    estimate: Decimal | None = None
    gpu_hours = Decimal(0)
    if usages:
        try:
            estimated = _at_todays_rates(usages, now)
        except rating.MissingRate as missing:
            problems.append(f"The time not metered yet cannot be estimated: {missing}.")
        else:
            estimate = sum((line.amount for line in estimated), ZERO)
            gpu_hours = sum(
                (line.quantity for line in estimated if line.resource == "gpu"), Decimal(0)
            )
    return JobCost(
        currency=currency,
        lines=lines,
        metered=sum((line.amount for line in lines), ZERO),
        metered_until=since,
        estimate=estimate,
        estimate_hours=gpu_hours,
        problem=" ".join(problems),
    )
