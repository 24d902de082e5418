"""Metering: allocations -> usage records, one closed hour at a time.

The metering rule: an allocation holds its devices (its GPU share), and its job's per-replica
CPU and memory, from its `started_at` (the devices are reserved then, before the pod is even
bound) to its `ended_at` (the daemon released them); an allocation not ended yet holds them
to the end of the hour being metered. Time is kept to the microsecond, as the database keeps it.

Crash order, per hour, all in ONE transaction:
  1. claim: insert the hour's MeteringPeriod row (unique start; a concurrent run blocks on it
     and then finds it taken, and skips the hour);
  2. read the allocations that overlap the hour;
  3. write one usage record per allocation (unique per allocation and hour), and the
     guarantees and devices of the hour (see below);
  4. finish: store the count on the period row.
A run that dies anywhere in 1-4 rolls back the whole hour: the period row and its records
exist together or not at all, so the next run meters the hour completely. An hour is metered
only once it is closed, and `GANTRY_METERING_DELAY_S` after that, so the daemon's last writes
about it are in.

Quotas and the inventory keep no history, so the guarantees and the devices of an hour are
read when the hour is metered: a quota changed, or a node cordoned, between the end of the
hour and its metering counts for the whole hour (docs/billing.md: the approximation).
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import IntegrityError, transaction
from django.db.models import Min, Q, Sum

from billing.budgets import spend_metered
from billing.models import CapacityRecord, GuaranteeRecord, MeteringPeriod, UsageRecord
from scheduler.models import Allocation, GpuDevice
from tenants.models import Quota

HOUR = timedelta(hours=1)
# The most hours one run meters; the next run goes on (a run stays short after an outage).
MAX_HOURS_PER_RUN = 24 * 7

Fault = Callable[[str], None]


def floor_hour(moment: datetime) -> datetime:
    return moment.astimezone(UTC).replace(minute=0, second=0, microsecond=0)


def hours_due(now: datetime, limit: int = MAX_HOURS_PER_RUN) -> list[datetime]:
    """Closed hours not metered yet, oldest first: from the first allocation's hour to the
    last hour that ended at least the metering delay before `now`."""
    until = floor_hour(now - timedelta(seconds=settings.GANTRY_METERING_DELAY_S))
    first = Allocation.objects.aggregate(first=Min("started_at"))["first"]
    if first is None:
        return []
    hour = floor_hour(first)
    done = set(
        MeteringPeriod.objects.filter(start__gte=hour, start__lt=until).values_list(
            "start", flat=True
        )
    )
    due: list[datetime] = []
    while hour < until and len(due) < limit:
        if hour not in done:
            due.append(hour)
        hour += HOUR
    return due


def meter_usage(*, now: datetime, fault: Fault | None = None) -> int:
    """Meter every closed hour that is due; the number of hours this run metered."""
    return sum(meter_hour(hour, now=now, fault=fault) for hour in hours_due(now))


def meter_hour(start: datetime, *, now: datetime, fault: Fault | None = None) -> bool:
    """Meter [start, start + 1 h) unless another run did; True when this run metered it.
    `fault(step)` is called between the steps (tests kill the run there)."""
    step = fault or (lambda name: None)
    end = start + HOUR
    try:
        with transaction.atomic():
            # 1. claim
            period = MeteringPeriod.objects.create(start=start, end=end, metered_at=now)
            step("claimed")
            # 2. read
            allocations = _overlapping(start, end)
            step("read")
            # 3. write
            records = [_record(period, a, start, end) for a in allocations]
            UsageRecord.objects.bulk_create(r for r in records if r.end > r.start)
            _record_guarantees_and_capacity(period)
            spend_metered(period, [r for r in records if r.end > r.start])
            step("written")
            # 4. finish
            period.records = len(records)
            period.save(update_fields=["records"])
            step("finished")
    except IntegrityError:
        # The hour (or a record of it) is there already: another run metered it.
        if MeteringPeriod.objects.filter(start=start).exists():
            return False
        raise
    return True


def _overlapping(start: datetime, end: datetime) -> list[Any]:
    return list(
        Allocation.objects.filter(started_at__lt=end)
        .filter(Q(ended_at__isnull=True) | Q(ended_at__gt=start))
        .select_related("job", "job__priority_class")
        .annotate(device_milli=Sum("devices__milli"))
        .order_by("id")
    )


def _record(period: MeteringPeriod, allocation: Any, start: datetime, end: datetime) -> Any:
    job = allocation.job
    held_to = end if allocation.ended_at is None else min(allocation.ended_at, end)
    return UsageRecord(
        period=period,
        allocation=allocation,
        start=max(allocation.started_at, start),
        end=held_to,
        flavor=allocation.flavor,
        # The device shares are the ledger of what is held; a job without devices (CPU
        # only) holds none, whatever `gpu_milli` says.
        gpu_milli=allocation.device_milli or 0,
        cpu_milli=job.cpu_milli,
        memory_mib=job.memory_mib,
        tenant_id=job.tenant_id,
        project_id=job.project_id,
        user_id=job.submitted_by_id,
        priority_class=job.priority_class.name,
        job_type=job.job_type,
        borrowed=not job.priority_class.counts_against_quota,
    )


def _record_guarantees_and_capacity(period: MeteringPeriod) -> None:
    GuaranteeRecord.objects.bulk_create(
        GuaranteeRecord(period=period, tenant_id=tenant_id, flavor=flavor, guaranteed_milli=milli)
        for tenant_id, flavor, milli in Quota.objects.filter(guaranteed_milli__gt=0).values_list(
            "tenant_id", "flavor__name", "guaranteed_milli"
        )
    )
    devices: dict[str, tuple[list[int], list[int]]] = {}
    rows = GpuDevice.objects.filter(node__present=True).values_list(
        "id",
        "node__flavor",
        "healthy",
        "node__ready",
        "node__cordoned",
        "node__cluster_unschedulable",
    )
    for device_id, flavor, healthy, ready, cordoned, unschedulable in rows.order_by("id"):
        available, unavailable = devices.setdefault(flavor, ([], []))
        ok = healthy and ready and not cordoned and not unschedulable
        (available if ok else unavailable).append(device_id)
    CapacityRecord.objects.bulk_create(
        CapacityRecord(period=period, flavor=flavor, available=a, unavailable=u)
        for flavor, (a, u) in devices.items()
    )
