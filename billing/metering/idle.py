"""Allocated but idle: GPU time that jobs held while their GPUs read under the idle threshold.

From the hourly per-job utilization roll-ups (scheduler/telemetry/rollups.py: `idle_gpu_seconds`,
the allocated GPU time of the samples under the holding tenant's threshold), priced at the
flavor's list GPU-hour rate of each hour (no priority multiplier, no borrowing discount: it
says what the idle time is worth, not what was charged for it). The lines are showback only:
the same GPU time is already in the used lines, so they are never charged and never change
a charged total. Without samples (a cluster without node agents) there are no lines.
"""

from __future__ import annotations

from collections import defaultdict
from datetime import datetime
from decimal import Decimal
from fractions import Fraction

from billing.models import LineKind
from billing.rates import rating
from billing.statements.rollup import DraftLine, price_at, rates_between
from scheduler.models import Job, RollupPeriod, RollupScope, UtilizationRollup
from tenants.models import Tenant

Account = tuple[int, int | None, int | None]  # tenant, project, user


def allocated_idle_lines(organisation: Tenant, start: datetime, end: datetime) -> list[DraftLine]:
    """One showback line per account (tenant, project, user) and flavor and rate: the
    allocated-but-idle GPU-hours of the organisation's jobs in the hours of [start, end)."""
    rows = list(
        UtilizationRollup.objects.filter(
            period=RollupPeriod.HOUR,
            scope=RollupScope.JOB,
            start__gte=start,
            start__lt=end,
            idle_gpu_seconds__gt=0,
            tenant__path__startswith=organisation.path,
        ).values_list("key_id", "tenant_id", "project_id", "flavor", "start", "idle_gpu_seconds")
    )
    if not rows:
        return []
    owners = dict(
        Job.objects.filter(id__in={r[0] for r in rows}).values_list("id", "submitted_by_id")
    )
    rates = rates_between(start, end)
    held: dict[tuple[Account, str, Decimal], Fraction] = defaultdict(Fraction)
    for job_id, tenant_id, project_id, flavor, hour, idle_seconds in rows:
        price = price_at(rates, flavor, hour).gpu_hour
        # In milli-GPU-seconds, the unit of GPU lines (billing/rates/rating.py).
        held[((tenant_id, project_id, owners.get(job_id)), flavor, price)] += Fraction(
            round(idle_seconds * 1000)
        )
    return [
        DraftLine(
            rating.make_line((account, flavor, "gpu", LineKind.ALLOCATED_IDLE, price, ""), units),
            charged=False,
        )
        for (account, flavor, price), units in sorted(held.items(), key=str)
    ]
