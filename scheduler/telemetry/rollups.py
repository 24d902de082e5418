"""Roll-ups of the raw samples into 5-minute and hourly aggregates, and retention.

Called by Celery beat (scheduler/tasks.py). Each window is rolled up in its own transaction
that holds the period's watermark row: two runs at once do each window once (the second
finds the watermark past it), and a run killed mid-way rolls back that window only, which
the next run does again. A window is rolled up `LAG` after it ends, so that the last
samples of it are in. Mean, max and p95 come from the window's raw samples (p95 by linear
interpolation between the closest ranks, as PostgreSQL's percentile_cont).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

import numpy as np
from django.conf import settings
from django.db import IntegrityError, transaction
from django.db.models import Min

from scheduler.models import (
    QueueSnapshot,
    RollupPeriod,
    RollupScope,
    RollupWatermark,
    UtilizationRollup,
    UtilizationSample,
    XidEvent,
)
from scheduler.telemetry.idle import rule_for_tenants

WINDOWS: dict[str, timedelta] = {
    RollupPeriod.FIVE_MINUTES: timedelta(minutes=5),
    RollupPeriod.HOUR: timedelta(hours=1),
}
LAG = timedelta(seconds=90)  # three sampling intervals: a late report still counts
MAX_WINDOWS_PER_RUN = 48  # per period: a run that catches up on a long outage stays short
EPOCH = datetime(2000, 1, 1, tzinfo=UTC)

# device, job, tenant, project, flavor, utilization, memory, power, share
Row = tuple[
    int | None, int | None, int | None, int | None, str, float, int | None, float | None, int
]
SAMPLE_FIELDS = (
    "device_id",
    "job_id",
    "tenant_id",
    "project_id",
    "flavor",
    "utilization_pct",
    "memory_used_mib",
    "power_w",
    "share_milli",
)


def floor_to(at: datetime, size: timedelta) -> datetime:
    return at - (at - EPOCH) % size


@dataclass
class _Group:
    tenant_id: int | None = None
    project_id: int | None = None
    utilization: list[float] = field(default_factory=list)
    memory: list[int] = field(default_factory=list)
    power: list[float] = field(default_factory=list)
    gpu_seconds: float = 0.0
    idle_gpu_seconds: float = 0.0


def aggregate(rows: Iterable[Row], thresholds: dict[int, float], interval_s: float) -> dict:  # type: ignore[type-arg]
    """Rows of one window -> {(scope, key_id, flavor): _Group}. A sample counts `interval_s`
    times its holder's share as allocated GPU time, and as idle GPU time when its utilization
    is under its tenant's threshold (`thresholds`, tenant id -> %)."""
    groups: dict[tuple[str, int, str], _Group] = defaultdict(_Group)
    for device, job, tenant, project, flavor, util, memory, power, share in rows:
        held = interval_s * share / 1000 if job is not None else 0.0
        idle = held if tenant is not None and util < thresholds.get(tenant, 0.0) else 0.0
        keys = [(RollupScope.DEVICE, device or 0, flavor), (RollupScope.FLAVOR, 0, flavor)]
        if job is not None:
            keys.append((RollupScope.JOB, job, flavor))
        if tenant is not None:
            keys.append((RollupScope.TENANT, tenant, flavor))  # quotas are per flavor
        for key in keys:
            group = groups[key]
            group.utilization.append(util)
            if memory is not None:
                group.memory.append(memory)
            if power is not None:
                group.power.append(power)
            group.gpu_seconds += held
            group.idle_gpu_seconds += idle
            if key[0] == RollupScope.JOB:
                group.tenant_id, group.project_id = tenant, project
    return groups


def _mean(values: Sequence[float]) -> float | None:
    return float(np.mean(values)) if values else None


def _rollups(period: str, start: datetime, groups: dict) -> list[UtilizationRollup]:  # type: ignore[type-arg]
    out = []
    for (scope, key_id, flavor), group in groups.items():
        values = np.asarray(group.utilization, dtype=float)
        out.append(
            UtilizationRollup(
                period=period,
                scope=scope,
                key_id=key_id,
                flavor=flavor,
                start=start,
                tenant_id=group.tenant_id,
                project_id=group.project_id,
                samples=len(values),
                utilization_mean=float(values.mean()),
                utilization_max=float(values.max()),
                utilization_p95=float(np.percentile(values, 95)),
                memory_used_mean_mib=_mean(group.memory),
                power_mean_w=_mean(group.power),
                gpu_seconds=group.gpu_seconds,
                idle_gpu_seconds=group.idle_gpu_seconds,
            )
        )
    return out


def _watermark(period: str) -> datetime | None:
    """The period's watermark, made at the window of the oldest sample when there is none.
    None: no sample yet."""
    found = RollupWatermark.objects.filter(name=period).values_list("done_until", flat=True)
    if found:
        return found[0]
    oldest = UtilizationSample.objects.aggregate(at=Min("at"))["at"]
    if oldest is None:
        return None
    try:
        with transaction.atomic():
            RollupWatermark.objects.create(
                name=period, done_until=floor_to(oldest, WINDOWS[period])
            )
    except IntegrityError:  # another run made it first
        pass
    return RollupWatermark.objects.get(name=period).done_until


def _roll_window(period: str, start: datetime, closed_until: datetime, interval_s: float) -> bool:
    """Roll up [start, start + period) if the watermark is still at `start`. False when
    another run did it meanwhile. An empty window moves the watermark on to the next sample's
    window (a quiet night is not rolled up window by window)."""
    size = WINDOWS[period]
    end = start + size
    with transaction.atomic():
        mark = RollupWatermark.objects.select_for_update().get(name=period)
        if mark.done_until != start:
            return False
        rows = list(
            UtilizationSample.objects.filter(at__gte=start, at__lt=end).values_list(*SAMPLE_FIELDS)
        )
        if not rows:
            later = UtilizationSample.objects.filter(at__gte=end).aggregate(at=Min("at"))["at"]
            mark.done_until = (
                closed_until if later is None else min(floor_to(later, size), closed_until)
            )
            mark.save(update_fields=["done_until"])
            return False
        thresholds = rule_for_tenants({r[2] for r in rows if r[2] is not None})
        groups = aggregate(
            rows, {t: rule.threshold_pct for t, rule in thresholds.items()}, interval_s
        )
        UtilizationRollup.objects.filter(period=period, start=start).delete()
        UtilizationRollup.objects.bulk_create(_rollups(period, start, groups), batch_size=2000)
        mark.done_until = end
        mark.save(update_fields=["done_until"])
    return True


def rollup_run(*, now: datetime) -> int:
    """Roll up every closed window not rolled up yet (at most MAX_WINDOWS_PER_RUN per period,
    oldest first). Returns the windows this run did."""
    interval_s = settings.GANTRY_UTILIZATION_SAMPLE_S
    done = 0
    for period, size in WINDOWS.items():
        start = _watermark(period)
        closed_until = floor_to(now - LAG, size)
        for _ in range(MAX_WINDOWS_PER_RUN):
            if start is None or start + size > closed_until:
                break
            done += _roll_window(period, start, closed_until, interval_s)
            start = RollupWatermark.objects.get(name=period).done_until
    return done


def retention_run(*, now: datetime) -> dict[str, int]:
    """Delete raw samples older than GANTRY_UTILIZATION_RAW_HOURS (but never one not rolled
    up yet into both periods), roll-ups older than their retention, and queue snapshots
    older than the 5-minute roll-ups; also the GPUs' XID history older than
    GANTRY_XID_RETENTION_DAYS."""
    cutoff = now - timedelta(hours=settings.GANTRY_UTILIZATION_RAW_HOURS)
    marks = list(
        RollupWatermark.objects.filter(name__in=list(WINDOWS)).values_list("done_until", flat=True)
    )
    if len(marks) == len(WINDOWS):
        cutoff = min(cutoff, *marks)
    else:
        cutoff = min(cutoff, UtilizationSample.objects.aggregate(at=Min("at"))["at"] or cutoff)
    deleted = {"raw": UtilizationSample.objects.filter(at__lt=cutoff).delete()[0]}
    keep = {
        RollupPeriod.FIVE_MINUTES: settings.GANTRY_UTILIZATION_5M_DAYS,
        RollupPeriod.HOUR: settings.GANTRY_UTILIZATION_1H_DAYS,
    }
    for period, days in keep.items():
        old = UtilizationRollup.objects.filter(period=period, start__lt=now - timedelta(days=days))
        deleted[period] = old.delete()[0]
    # The queue's 5-minute snapshots (the dashboards) are kept as long as the 5-minute roll-ups.
    days = settings.GANTRY_UTILIZATION_5M_DAYS
    deleted["queue"] = QueueSnapshot.objects.filter(at__lt=now - timedelta(days=days)).delete()[0]
    xid_cutoff = now - timedelta(days=settings.GANTRY_XID_RETENTION_DAYS)
    deleted["xid"] = XidEvent.objects.filter(seen_at__lt=xid_cutoff).delete()[0]
    return deleted
