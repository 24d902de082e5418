"""The metered hours of a period, split per flavor into used, unavailable, idle reserved and
unreserved idle (billing/metering/capacity.py), from the usage, guarantee and capacity records;
and per flavor and cluster, with the idle reserved shares located on the clusters
(billing/metering/located.py)."""

from __future__ import annotations

from collections import defaultdict
from datetime import datetime, timedelta
from fractions import Fraction
from typing import Any

from django.db.models import BigIntegerField, F, Sum

from billing.metering.capacity import DEVICE_HOUR, HolderSum, HourSplit, split_sums
from billing.metering.located import fit_idle, guarantee_by_cluster, locate_share
from billing.models import CapacityRecord, GuaranteeRecord, MeteringPeriod, UsageRecord
from scheduler.models import Cluster, GpuDevice
from tenants.models import Tenant

SplitKey = tuple[datetime, str]  # (hour, flavor)
ClusterKey = tuple[datetime, str, str]  # (hour, flavor, cluster)
MICROSECOND = timedelta(microseconds=1)
MICROS = 1_000_000  # microseconds in a second
# (hour, flavor) -> the flavor's split across every cluster, and its part on each cluster.
Splits = dict[SplitKey, tuple[HourSplit, dict[str, HourSplit]]]
Devices = tuple[list[int], list[int]]  # available, unavailable


def seconds(start: datetime, end: datetime) -> Fraction:
    return Fraction((end - start) // timedelta(microseconds=1), 1_000_000)


def ancestors(path: str) -> list[int]:
    """Tenant ids from the root down to the tenant itself ("/1/4/9/" -> [1, 4, 9])."""
    return [int(part) for part in path.strip("/").split("/") if part]


def hour_splits(start: datetime, end: datetime) -> dict[SplitKey, HourSplit]:
    """Every metered hour in [start, end), per flavor present or used in it, across every
    cluster (the quota tree is global: each holder's idle share is the flavor's)."""
    return {key: whole for key, (whole, _) in _splits(start, end).items()}


def cluster_splits(start: datetime, end: datetime) -> dict[ClusterKey, HourSplit]:
    """Every metered hour in [start, end), per flavor and cluster (issue 38): each cluster's
    capacity, used and unavailable, and the idle reserved shares located on it
    (billing/metering/located.py); its unreserved idle is what is left of its idle. The
    clusters' splits of an hour and flavor add up to `hour_splits`' exactly, part by part and
    tenant by tenant. With one cluster, they are `hour_splits`' under its name."""
    return {
        (hour, flavor, cluster): split
        for (hour, flavor), (_, per_cluster) in _splits(start, end).items()
        for cluster, split in per_cluster.items()
    }


def _splits(start: datetime, end: datetime) -> Splits:
    """Read in slices of hours (`statements.period_slices`): memory holds the splits and one
    slice of records. Quantities add up as integers (milli x microseconds) and become exact
    fractions once per device and tenant of an hour."""
    from billing.statements.rollup import period_slices

    paths = dict(Tenant.objects.values_list("id", "path"))
    lineage = {tenant_id: ancestors(path) for tenant_id, path in paths.items()}
    home = Cluster.objects.filter(home=True).values_list("name", flat=True).first() or ""
    splits: Splits = {}
    devices: list[int] | None = None  # read once, when a slice needs them
    for slice_ids in period_slices(start, end):
        if devices is None:
            devices = list(GpuDevice.objects.values_list("id", flat=True))
        splits.update(_slice_splits(slice_ids, paths, lineage, devices, home))
    return splits


def _slice_splits(
    period_ids: list[int],
    paths: dict[int, str],
    lineage: dict[int, list[int]],
    devices: list[int],
    home: str,
) -> Splits:
    """The splits of a slice of hours, from sums the database makes (milli x microseconds,
    integers, so exact): what each tenant held per hour, flavor and cluster (a record's
    `gpu_milli` is the sum of its allocation's device shares), and what was held on each
    device that matters to the split: one unavailable, or missing from the inventory, in an
    hour. A device available in every hour of the slice adds nothing but its share of the
    total. Records and devices of before clusters ("") are the home cluster's."""
    periods = dict(MeteringPeriod.objects.filter(id__in=period_ids).values_list("id", "start"))
    records = UsageRecord.objects.filter(period_id__in=period_ids).order_by()
    recorded = _recorded(periods, home)
    by_tenant: dict[SplitKey, dict[int, int]] = defaultdict(lambda: defaultdict(int))
    used: dict[SplitKey, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    for period_id, flavor, tenant_id, cluster, value in records.values_list(
        "period_id", "flavor", "tenant_id", "cluster"
    ).annotate(held=Sum(F("gpu_milli") * F("micros"), output_field=BigIntegerField())):
        if not value:  # CPU only: no device
            continue
        key = (periods[period_id], flavor)
        used[key][cluster or home] += value
        subtree = by_tenant[key]
        for ancestor in lineage[tenant_id]:
            subtree[ancestor] += value
    by_device: dict[SplitKey, dict[int, int]] = defaultdict(lambda: defaultdict(int))
    ran_on: dict[int, str] = {}  # a device missing from the inventory: its records' cluster
    merged = recorded.merged()
    for period_id, flavor, device_id, cluster, value in (
        records.filter(allocation__devices__device_id__in=_not_always_available(merged, devices))
        .values_list("period_id", "flavor", "allocation__devices__device_id", "cluster")
        .annotate(
            held=Sum(F("allocation__devices__milli") * F("micros"), output_field=BigIntegerField())
        )
    ):
        by_device[(periods[period_id], flavor)][device_id] += value
        ran_on.setdefault(device_id, cluster or home)
    splits: Splits = {}
    for key in set(merged) | set(recorded.guarantees) | set(used):
        available, unavailable = merged.get(key, ([], []))
        on_device = by_device.get(key, {})
        down = set(unavailable) - set(available)
        present = len(set(available) | down | set(on_device))
        whole = split_sums(
            capacity=DEVICE_HOUR * present * MICROS,
            used=sum(used.get(key, {}).values()),
            down=sum(DEVICE_HOUR * MICROS - on_device.get(d, 0) for d in down),
            holders=_holders(recorded.guarantees.get(key, {}), by_tenant.get(key, {}), paths),
            seconds=3600,
            scale=MICROS,
        )
        clusters = recorded.clusters(key) | set(used.get(key, {}))
        if len(clusters) <= 1:  # one cluster (most installations): the flavor's split is its
            splits[key] = (whole, {next(iter(clusters), home): whole})
            continue
        hour = _Hour(recorded.capacity.get(key, {}), on_device, ran_on, home)
        splits[key] = (whole, hour.per_cluster(whole, used.get(key, {}), recorded, key))
    return splits


class _Hour:
    """One hour and flavor's devices by cluster: what `cluster_splits` locates."""

    def __init__(
        self,
        capacity: dict[str, Devices],
        on_device: dict[int, int],
        ran_on: dict[int, str],
        home: str,
    ) -> None:
        self.on_device, self.home = on_device, home
        self.where: dict[int, str] = {}
        self.available: dict[str, int] = {}
        for cluster, (available, unavailable) in capacity.items():
            self.where.update(dict.fromkeys(unavailable, cluster))
            self.where.update(dict.fromkeys(available, cluster))
            self.available[cluster] = len(set(available))
        for device in on_device:
            self.where.setdefault(device, ran_on[device])
        # Unavailable and nowhere available (as the flavor's split counts them).
        self.down = {d for _, u in capacity.values() for d in u} - {
            d for a, _ in capacity.values() for d in a
        }

    def present(self) -> dict[str, int]:
        counts: dict[str, int] = defaultdict(int)
        for cluster in self.where.values():
            counts[cluster] += 1
        return counts

    def weights(self) -> dict[str, int]:
        """The clusters' available devices, else their devices present, else the home."""
        if any(self.available.values()):
            return self.available
        present = self.present()
        return present if any(present.values()) else {self.home: 1}

    def per_cluster(
        self, whole: HourSplit, used: dict[str, int], recorded: _Recorded, key: SplitKey
    ) -> dict[str, HourSplit]:
        """`whole` (the flavor's split of the hour) per cluster: parts that add up to it
        exactly, each holder's shares included; `used`: milli x microseconds per cluster."""
        # 1. each holder's share located (billing/metering/located.py)
        located: dict[str, dict[int, Fraction]] = defaultdict(dict)
        weights = self.weights()
        for tenant, share in whole.idle_reserved.items():
            pins = recorded.pins.get(key, {}).get(tenant, {})
            floating = max(0, recorded.guarantees[key][tenant] - sum(pins.values()))
            guarantee = guarantee_by_cluster(pins=pins, floating=floating, devices=weights)
            for cluster, part in locate_share(share, guarantee).items():
                located[cluster][tenant] = part
        # 2. each cluster's capacity, use and unavailable devices, and its idle
        present = self.present()
        down: dict[str, int] = defaultdict(int)
        for device in self.down:
            down[self.where[device]] += DEVICE_HOUR * MICROS - self.on_device.get(device, 0)
        parts = {
            cluster: (
                Fraction(DEVICE_HOUR * present.get(cluster, 0)),
                Fraction(used.get(cluster, 0), MICROS),
                Fraction(down.get(cluster, 0), MICROS),
            )
            for cluster in sorted(set(present) | set(used) | set(located))
        }
        # 3. no cluster holds more idle reserved than it had idle
        fitted = fit_idle(located, {c: cap - held - off for c, (cap, held, off) in parts.items()})
        out = {}
        for cluster, (capacity, held, unavailable) in parts.items():
            shares = fitted.get(cluster, {})
            reserved = sum(shares.values(), Fraction(0))
            out[cluster] = HourSplit(
                capacity, held, unavailable, shares, capacity - held - unavailable - reserved
            )
        return out


def _not_always_available(capacity: dict[SplitKey, Devices], devices: list[int]) -> list[int]:
    """Every device but those available in each hour of the slice (for each of them the
    split needs no sum of its own: it is in the hour's available devices)."""
    per_hour: dict[datetime, set[int]] = defaultdict(set)
    for (hour, _), (available, _) in capacity.items():
        per_hour[hour] |= set(available)
    always = set.intersection(*per_hour.values()) if per_hour else set()
    return sorted(set(devices) - always)


class _Recorded:
    """The capacity and guarantee records of some hours, per (hour, flavor): the devices of
    each cluster; each holder's global guarantee (its global quota, else the sum of its pins:
    a tenant that pins a flavor and sets no global quota holds their sum globally,
    docs/multicluster.md); and its pins per cluster."""

    def __init__(self) -> None:
        self.capacity: dict[SplitKey, dict[str, Devices]] = defaultdict(dict)
        self.guarantees: dict[SplitKey, dict[int, int]] = defaultdict(dict)
        self.pins: dict[SplitKey, dict[int, dict[str, int]]] = defaultdict(
            lambda: defaultdict(dict)
        )

    def clusters(self, key: SplitKey) -> set[str]:
        """The clusters with devices of the hour's flavor, or a pin of it."""
        pinned = {c for pins in self.pins.get(key, {}).values() for c in pins}
        return set(self.capacity.get(key, {})) | pinned

    def merged(self) -> dict[SplitKey, Devices]:
        """The devices of each hour and flavor, every cluster's together."""
        return {
            key: (
                [d for a, _ in clusters.values() for d in a],
                [d for _, u in clusters.values() for d in u],
            )
            for key, clusters in self.capacity.items()
        }


def _recorded(periods: dict[int, datetime], home: str) -> _Recorded:
    recorded = _Recorded()
    for p, flavor, cluster, available, unavailable in CapacityRecord.objects.filter(
        period_id__in=list(periods)
    ).values_list("period_id", "flavor", "cluster", "available", "unavailable"):
        recorded.capacity[(periods[p], flavor)][cluster or home] = (available, unavailable)
    global_rows: dict[SplitKey, dict[int, int]] = defaultdict(dict)
    for p, tenant_id, flavor, milli, cluster in GuaranteeRecord.objects.filter(
        period_id__in=list(periods)
    ).values_list("period_id", "tenant_id", "flavor", "guaranteed_milli", "cluster"):
        key = (periods[p], flavor)
        if cluster:
            recorded.pins[key][tenant_id][cluster] = milli
        else:
            global_rows[key][tenant_id] = milli
    for key in set(global_rows) | set(recorded.pins):
        pinned = {t: sum(c.values()) for t, c in recorded.pins.get(key, {}).items()}
        recorded.guarantees[key] = {**pinned, **global_rows.get(key, {})}
    return recorded


def _capacity_and_guarantees(periods: dict[int, datetime]) -> tuple[Any, Any]:
    """The devices (every cluster's) and each holder's global guarantee per (hour, flavor)."""
    recorded = _recorded(periods, "")
    return recorded.merged(), recorded.guarantees


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
