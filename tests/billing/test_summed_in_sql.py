"""Statements sum the usage records in SQL (billing/statements/rollup.py `usage_lines`,
billing/metering/splits.py): the same lines, and the same hour splits, as rating the records one by
one in Python, which is what closing did before. The oracle below is that code, on a small
month of the billing benchmark (preemptions, failures, a rate change, fractional shares,
cordoned nodes)."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterator
from datetime import datetime
from fractions import Fraction
from pathlib import Path
from typing import Any

import pytest

from bench.billing import build, meter, shape
from billing.metering.attempts import attempt_kinds
from billing.metering.capacity import Holder, HourSplit, split_hour
from billing.metering.splits import SplitKey, _capacity_and_guarantees, ancestors, hour_splits
from billing.models import MeteringPeriod, UsageRecord
from billing.rates import rating
from billing.statements.rollup import period_slices, rates_between, usage_lines
from scheduler.models import AllocationDevice
from tenants.models import Tenant


def rated_one_by_one(
    organisation: Tenant, start: datetime, end: datetime, detail: bool
) -> list[rating.Line]:
    """The lines of the organisation's usage records, each record read and rated in Python."""
    return rating.rate_usage(_usages(organisation, start, end, detail), rates_between(start, end))


def _usages(organisation: Tenant, start: datetime, end: datetime, detail: bool) -> Iterator[Any]:
    for periods in period_slices(start, end):
        rows = list(
            UsageRecord.objects.filter(
                period_id__in=periods, tenant__path__startswith=organisation.path
            )
            .order_by("period_id", "allocation_id")
            .values_list(
                "allocation_id",
                "allocation__job_id",
                "allocation__started_at",
                "tenant_id",
                "project_id",
                "user_id",
                "flavor",
                "start",
                "end",
                "gpu_milli",
                "cpu_milli",
                "memory_mib",
                "priority_class",
                "borrowed",
                "job_type",
                "cluster",
            )
        )
        kinds = attempt_kinds({(r[0], r[1], r[2]) for r in rows})
        for r in rows:
            yield rating.Usage(
                (r[3], r[4], r[5], r[14], r[12]) if detail else (r[3], r[4], r[5]),
                r[6],
                kinds[r[0]],
                *r[7:12],
                r[12],
                r[13],
                r[15],
            )


def holders(
    guaranteed: dict[int, int], used: dict[int, Fraction], paths: dict[int, str]
) -> list[Holder]:
    """Each holder with its nearest holding ancestor, its use in exact fractions (the split
    the database's integer sums must equal)."""
    out = []
    for tenant_id, milli in guaranteed.items():
        above = [a for a in ancestors(paths[tenant_id])[:-1] if a in guaranteed]
        out.append(
            Holder(tenant_id, above[-1] if above else None, milli, used.get(tenant_id, Fraction(0)))
        )
    return out


def split_per_device(start: datetime, end: datetime) -> dict[SplitKey, HourSplit]:
    """Every hour's split from each record's device shares, added up in Python."""
    paths = dict(Tenant.objects.values_list("id", "path"))
    periods = dict(
        MeteringPeriod.objects.filter(start__gte=start, start__lt=end).values_list("id", "start")
    )
    records = list(
        UsageRecord.objects.filter(period_id__in=list(periods)).values_list(
            "period_id", "allocation_id", "start", "end", "flavor", "tenant_id"
        )
    )
    shares: dict[int, list[tuple[int, int]]] = defaultdict(list)
    for allocation_id, device_id, milli in AllocationDevice.objects.values_list(
        "allocation_id", "device_id", "milli"
    ):
        shares[allocation_id].append((device_id, milli))
    by_device: dict[SplitKey, dict[int, Fraction]] = defaultdict(lambda: defaultdict(Fraction))
    own: dict[SplitKey, dict[int, Fraction]] = defaultdict(lambda: defaultdict(Fraction))
    for period_id, allocation_id, lo, hi, flavor, tenant_id in records:
        key = (periods[period_id], flavor)
        seconds = rating.held(rating.Usage(0, flavor, "", lo, hi, 1))["gpu"]
        for device_id, milli in shares[allocation_id]:
            by_device[key][device_id] += milli * seconds
            for ancestor in ancestors(paths[tenant_id]):
                own[key][ancestor] += milli * seconds
    capacity, guarantees = _capacity_and_guarantees(periods)
    return {
        key: split_hour(
            available=set(capacity.get(key, ([], []))[0]),
            unavailable=set(capacity.get(key, ([], []))[1]),
            used_by_device=dict(by_device.get(key, {})),
            holders=holders(guarantees.get(key, {}), dict(own.get(key, {})), paths),
        )
        for key in set(capacity) | set(guarantees) | set(by_device)
    }


@pytest.fixture
def month(db: Any, tmp_path: Path) -> Any:
    month = shape(16, 2, 300, 1)
    build(month)
    meter(month)
    return month


@pytest.mark.parametrize("detail", [True, False])
def test_usage_lines_summed_in_sql_equal_the_records_rated_one_by_one(
    month: Any, detail: bool
) -> None:
    for organisation in Tenant.objects.filter(parent__isnull=True):
        summed = usage_lines(organisation, month.start, month.end, detail=detail)
        one_by_one = rated_one_by_one(organisation, month.start, month.end, detail)
        # The same lines, to the exact quantity and the cent, in the same order.
        assert summed == one_by_one
        kinds = {line.kind for line in summed}
        assert {"used", "preempted", "failed"} <= kinds, kinds


def test_hour_splits_summed_in_sql_equal_the_shares_added_up_per_device(month: Any) -> None:
    summed = hour_splits(month.start, month.end)
    assert summed == split_per_device(month.start, month.end)
    assert any(split.unavailable for split in summed.values())
    assert any(split.idle_reserved for split in summed.values())


def test_a_usage_record_keeps_its_microseconds(month: Any) -> None:
    for start, end, micros in UsageRecord.objects.values_list("start", "end", "micros")[:500]:
        assert micros == (end - start) // rating.MICROSECOND
