"""The metered hours of a period, split per flavor into used, unavailable, idle reserved and
unreserved idle (billing/capacity.py), from the usage, guarantee and capacity records."""

from __future__ import annotations

from collections import defaultdict
from datetime import datetime, timedelta
from fractions import Fraction
from typing import Any

from billing.capacity import Holder, HourSplit, split_hour
from billing.models import CapacityRecord, GuaranteeRecord, MeteringPeriod, UsageRecord
from scheduler.models import AllocationDevice
from tenants.models import Tenant

SplitKey = tuple[datetime, str]  # (hour, flavor)
MICROSECOND = timedelta(microseconds=1)


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
    from billing.statements import period_slices

    paths = dict(Tenant.objects.values_list("id", "path"))
    lineage = {tenant_id: ancestors(path) for tenant_id, path in paths.items()}
    splits: dict[SplitKey, HourSplit] = {}
    for slice_ids in period_slices(start, end):
        splits.update(_slice_splits(slice_ids, paths, lineage))
    return splits


def _slice_splits(
    period_ids: list[int], paths: dict[int, str], lineage: dict[int, list[int]]
) -> dict[SplitKey, HourSplit]:
    periods = dict(MeteringPeriod.objects.filter(id__in=period_ids).values_list("id", "start"))
    records = list(
        UsageRecord.objects.filter(period_id__in=period_ids).values_list(
            "period_id", "allocation_id", "start", "end", "flavor", "tenant_id"
        )
    )
    shares: dict[int, list[tuple[int, int]]] = defaultdict(list)
    for allocation_id, device_id, milli in AllocationDevice.objects.filter(
        allocation_id__in={r[1] for r in records}
    ).values_list("allocation_id", "device_id", "milli"):
        shares[allocation_id].append((device_id, milli))
    by_device: dict[SplitKey, dict[int, int]] = defaultdict(lambda: defaultdict(int))
    own: dict[SplitKey, dict[int, int]] = defaultdict(lambda: defaultdict(int))
    for period_id, allocation_id, lo, hi, flavor, tenant_id in records:
        key, micros = (periods[period_id], flavor), (hi - lo) // MICROSECOND
        devices = by_device[key]
        for device_id, milli in shares[allocation_id]:
            devices[device_id] += milli * micros
            own[key][tenant_id] += milli * micros
    by_tenant: dict[SplitKey, dict[int, Fraction]] = {}
    for key, held in own.items():
        subtree: dict[int, int] = defaultdict(int)
        for tenant_id, value in held.items():
            for ancestor in lineage[tenant_id]:
                subtree[ancestor] += value
        by_tenant[key] = {t: Fraction(v, 1_000_000) for t, v in subtree.items()}
    capacity, guarantees = _capacity_and_guarantees(periods)
    splits = {}
    for key in set(capacity) | set(guarantees) | set(by_device):
        available, unavailable = capacity.get(key, ([], []))
        used = {d: Fraction(v, 1_000_000) for d, v in by_device.get(key, {}).items()}
        splits[key] = split_hour(
            available=set(available),
            unavailable=set(unavailable),
            used_by_device=used,
            holders=_holders(guarantees.get(key, {}), by_tenant.get(key, {}), paths),
        )
    return splits


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
    guaranteed: dict[int, int], used: dict[int, Fraction], paths: dict[int, str]
) -> list[Holder]:
    """Each holder with its nearest holding ancestor (a parent's guarantee holds its own)."""
    holders = []
    for tenant_id, milli in guaranteed.items():
        above = [a for a in ancestors(paths[tenant_id])[:-1] if a in guaranteed]
        holders.append(
            Holder(tenant_id, above[-1] if above else None, milli, used.get(tenant_id, Fraction(0)))
        )
    return holders
