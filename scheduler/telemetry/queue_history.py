"""The queue's history for the dashboards: one `QueueSnapshot` row per 5-minute window.

Queue length and fragmentation are states, not device samples, so the roll-ups cannot give
their history, and replaying job events for every page view would grow with the history.
The roll-up task (scheduler/tasks.py) calls `queue_snapshot_take` every minute; it writes the
last closed window once (its unique constraints make a second run, or two at once, a no-op).
A window the task did not run for stays missing: the charts show a gap, not an invented value.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from django.db import IntegrityError, transaction
from django.db.models import Count, F, OuterRef, Subquery, Sum

from scheduler.metrics.cluster_queues import WAIT_BUCKETS_S
from scheduler.metrics.fragmentation import WHOLE, free_and_fragmented
from scheduler.models import GpuDevice, Job, JobEvent, JobState, QueueSnapshot
from scheduler.telemetry.rollups import floor_to

WINDOW = timedelta(minutes=5)


def wait_bucket(wait_s: float) -> int:
    """The index of the first bucket of WAIT_BUCKETS_S that holds `wait_s` (the last: longer)."""
    for index, bound in enumerate(WAIT_BUCKETS_S):
        if wait_s <= bound:
            return index
    return len(WAIT_BUCKETS_S)


def admission_waits(start: datetime, end: datetime) -> list[tuple[int, float]]:
    """(tenant id, wait s) of each admission in [start, end): the time since the job's
    previous entry into the queue (submission, approval or requeue), as the metrics' wait
    histogram counts it. One query; the subquery is per admission of the window only."""
    entered = (
        JobEvent.objects.filter(
            job=OuterRef("job"), to_state=JobState.QUEUED, id__lt=OuterRef("id")
        )
        .order_by("-id")
        .values("at")[:1]
    )
    rows = (
        JobEvent.objects.filter(
            at__gte=start, at__lt=end, to_state=JobState.ADMITTED, from_state=JobState.QUEUED
        )
        .annotate(entered=Subquery(entered))
        .values_list("job__tenant_id", "at", "entered")
    )
    return [(t, max(0.0, (at - e).total_seconds())) for t, at, e in rows if e is not None]


def _rows(at: datetime, end: datetime) -> dict[int | None, QueueSnapshot]:
    rows: dict[int | None, QueueSnapshot] = {}

    def row(tenant_id: int | None) -> QueueSnapshot:
        if tenant_id not in rows:
            buckets = [0] * (len(WAIT_BUCKETS_S) + 1)
            rows[tenant_id] = QueueSnapshot(at=at, tenant_id=tenant_id, wait_buckets=buckets)
        return rows[tenant_id]

    row(None)
    queued = (
        Job.objects.filter(state=JobState.QUEUED)
        .values_list("tenant_id")
        .annotate(n=Count("id"), milli=Sum(F("gpu_milli_per_replica") * F("replicas")))
        .order_by()
    )
    for tenant_id, n, milli in queued:
        for snapshot in (row(tenant_id), row(None)):
            snapshot.queued_jobs += n
            snapshot.queued_gpus += (milli or 0) / WHOLE
    for tenant_id, wait in admission_waits(at, end):
        for snapshot in (row(tenant_id), row(None)):
            snapshot.admissions += 1
            snapshot.wait_sum_s += wait
            snapshot.wait_buckets[wait_bucket(wait)] += 1
    return rows


def queue_snapshot_take(*, now: datetime) -> bool:
    """Write the snapshot of the last closed 5-minute window, once. False when it exists."""
    at = floor_to(now, WINDOW) - WINDOW
    if QueueSnapshot.objects.filter(at=at, tenant__isnull=True).exists():
        return False
    rows = _rows(at, at + WINDOW)
    total, stranded = free_and_fragmented()
    # Every flavor of the cluster gets its pair, 0 when full: a full cluster is not a gap.
    present = GpuDevice.objects.filter(node__present=True).values_list("node__flavor", flat=True)
    flavors: dict[str, list[float]] = {flavor: [0.0, 0.0] for flavor in present.distinct()}
    for flavor, milli in total.items():
        flavors[flavor] = [milli / WHOLE, stranded.get(flavor, 0) / WHOLE]
    rows[None].flavors = dict(flavors)
    try:
        with transaction.atomic():
            QueueSnapshot.objects.bulk_create(rows.values())
    except IntegrityError:  # another run wrote this window first
        return False
    return True
