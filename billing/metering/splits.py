"""The metered hours of a period, split per flavor into used, unavailable, idle reserved and
unreserved idle (billing/metering/capacity.py), from the usage, guarantee and capacity records."""

from __future__ import annotations

from collections import defaultdict
from datetime import datetime, timedelta
from fractions import Fraction
from typing import Any

from django.db.models import BigIntegerField, F, Sum

from billing.metering.capacity import DEVICE_HOUR, HolderSum, HourSplit, split_sums
from billing.models import CapacityRecord, GuaranteeRecord, MeteringPeriod, UsageRecord
from scheduler.models import GpuDevice
from tenants.models import Tenant

SplitKey = tuple[datetime, str]  # (hour, flavor)
MICROSECOND = timedelta(microseconds=1)
MICROS = 1_000_000  # microseconds in a second


def seconds(start: datetime, end: datetime) -> Fraction:
    return Fraction((end - start) // timedelta(microseconds=1), 1_000_000)


def ancestors(path: str) -> list[int]:
    """Tenant ids from the root down to the tenant itself ("/1/4/9/" -> [1, 4, 9])."""
    return [int(part) for part in path.strip("/").split("/") if part]


def hour_splits(start: datetime, end: datetime) -> dict[SplitKey, HourSplit]:
    """Every metered hour in [start, end), per flavor present or used in it.

    Read in slices of hours (`statements.period_slices`): memory holds the splits and one
    slice of records. Quantities add up as integers (milli x microseconds) and become exact
    fractions once per device and tenant of an hour."""
    from billing.statements.rollup import period_slices

    paths = dict(Tenant.objects.values_list("id", "path"))
    lineage = {tenant_id: ancestors(path) for tenant_id, path in paths.items()}
    splits: dict[SplitKey, HourSplit] = {}
    devices: list[int] | None = None  # read once, when a slice needs them
    for slice_ids in period_slices(start, end):
        if devices is None:
            devices = list(GpuDevice.objects.values_list("id", flat=True))
        splits.update(_slice_splits(slice_ids, paths, lineage, devices))
    return splits


def _slice_splits(
    period_ids: list[int], paths: dict[int, str], lineage: dict[int, list[int]], devices: list[int]
) -> dict[SplitKey, HourSplit]:
    """The splits of a slice of hours, from sums the database makes (milli x microseconds,
    integers, so exact): what each tenant held per hour and flavor (a record's `gpu_milli`
    is the sum of its allocation's device shares), and what was held on each device that
    matters to the split: one unavailable, or missing from the inventory, in an hour. A
    device available in every hour of the slice adds nothing but its share of the total."""
    periods = dict(MeteringPeriod.objects.filter(id__in=period_ids).values_list("id", "start"))
    records = UsageRecord.objects.filter(period_id__in=period_ids).order_by()
    capacity, guarantees = _capacity_and_guarantees(periods)
    by_tenant: dict[SplitKey, dict[int, int]] = defaultdict(lambda: defaultdict(int))
    used: dict[SplitKey, int] = defaultdict(int)
    for period_id, flavor, tenant_id, value in records.values_list(
        "period_id", "flavor", "tenant_id"
    ).annotate(held=Sum(F("gpu_milli") * F("micros"), output_field=BigIntegerField())):
        if not value:  # CPU only: no device
            continue
        key = (periods[period_id], flavor)
        used[key] += value
        subtree = by_tenant[key]
        for ancestor in lineage[tenant_id]:
            subtree[ancestor] += value
    by_device: dict[SplitKey, dict[int, int]] = defaultdict(dict)
    for period_id, flavor, device_id, value in (
        records.filter(allocation__devices__device_id__in=_not_always_available(capacity, devices))
        .values_list("period_id", "flavor", "allocation__devices__device_id")
        .annotate(
            held=Sum(F("allocation__devices__milli") * F("micros"), output_field=BigIntegerField())
        )
    ):
        by_device[(periods[period_id], flavor)][device_id] = value
    splits = {}
    for key in set(capacity) | set(guarantees) | set(used):
        available, unavailable = capacity.get(key, ([], []))
        on_device = by_device.get(key, {})
        down = set(unavailable) - set(available)
        present = len(set(available) | down | set(on_device))
        splits[key] = split_sums(
            capacity=DEVICE_HOUR * present * MICROS,
            used=used.get(key, 0),
            down=sum(DEVICE_HOUR * MICROS - on_device.get(d, 0) for d in down),
            holders=_holders(guarantees.get(key, {}), by_tenant.get(key, {}), paths),
            seconds=3600,
            scale=MICROS,
        )
    return splits


def _not_always_available(
    capacity: dict[SplitKey, tuple[list[int], list[int]]], devices: list[int]
) -> list[int]:
    """Every device but those available in each hour of the slice (for each of them the
    split needs no sum of its own: it is in the hour's available devices)."""
    per_hour: dict[datetime, set[int]] = defaultdict(set)
    for (hour, _), (available, _) in capacity.items():
        per_hour[hour] |= set(available)
    always = set.intersection(*per_hour.values()) if per_hour else set()
    return sorted(set(devices) - always)


def _capacity_and_guarantees(periods: dict[int, datetime]) -> tuple[Any, Any]:
    capacity = {
        (periods[p], flavor): (available, unavailable)
        for p, flavor, available, unavailable in CapacityRecord.objects.filter(
            period_id__in=list(periods)
        ).values_list("period_id", "flavor", "available", "unavailable")
    }
    guarantees: dict[SplitKey, dict[int, int]] = defaultdict(dict)
    for p, tenant_id, flavor, milli in GuaranteeRecord.objects.filter(
        period_id__in=list(periods)
    ).values_list("period_id", "tenant_id", "flavor", "guaranteed_milli"):
        guarantees[(periods[p], flavor)][tenant_id] = milli
    return capacity, guarantees


def _holders(
    guaranteed: dict[int, int], used: dict[int, int], paths: dict[int, str]
) -> list[HolderSum]:
    """Each holder with its nearest holding ancestor (a parent's guarantee holds its own);
    `used`: milli x microseconds."""
    holders = []
    for tenant_id, milli in guaranteed.items():
        above = [a for a in ancestors(paths[tenant_id])[:-1] if a in guaranteed]
        holders.append(
            HolderSum(tenant_id, above[-1] if above else None, milli, used.get(tenant_id, 0))
        )
    return holders
