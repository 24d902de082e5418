"""The daemon's bulk writes other than state changes (`scheduler.jobs.transitions`): waiting
reasons, allocations with their device shares, and releases."""

from __future__ import annotations

import logging
from collections import defaultdict
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

from django.db import connection

from common.db.bulk import copy_rows
from scheduler.models import (
    Allocation,
    AllocationDevice,
    Job,
    JobState,
)

log = logging.getLogger("gantry.daemon")
S = JobState


REASONS_SQL = (  # by primary key, as CLAIM_SQL
    "UPDATE scheduler_job AS j SET reason = v.reason"
    " FROM unnest(%s::bigint[], %s::text[]) AS v(id, reason)"
    " WHERE j.id = v.id AND j.state || '' = %s RETURNING j.id, j.xmin::text::bigint, v.reason"
)


def set_reasons(reasons: Mapping[int, str], versions: dict[int, int] | None = None) -> int:
    """Write each queued job's new reason. PostgreSQL: one UPDATE from arrays, whose new row
    versions go to `versions` when given. Elsewhere: one UPDATE per distinct text (equal jobs
    wait for equal reasons)."""
    changed = {i: r[:500] for i, r in reasons.items()}
    if not changed:
        return 0
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute(REASONS_SQL, [list(changed), list(changed.values()), S.QUEUED])
            written = cursor.fetchall()
        if versions is not None:
            versions.update((job_id, version) for job_id, version, _ in written)
        return len(written)
    by_text: dict[str, list[int]] = defaultdict(list)
    for job_id, text in changed.items():
        by_text[text].append(job_id)
    return sum(
        Job.objects.filter(id__in=ids, state=S.QUEUED).update(reason=text)
        for text, ids in by_text.items()
    )


# By primary key, as CLAIM_SQL: written plainly, `ended_at IS NULL` let the planner take a
# partial index of active allocations, which holds an entry for every allocation ended
# since the last VACUUM (20,000 entries read to end 100 in bench.daemon_drain).
RELEASE_SQL = (
    "UPDATE scheduler_allocation SET ended_at = %s, end_reason = %s"
    " WHERE id = ANY(%s) AND num_nulls(ended_at) = 1"
)

RELEASE_SHARES_SQL = (
    "UPDATE scheduler_allocationdevice SET released = true"
    " WHERE allocation_id = ANY(%s) AND NOT released"
)


def release(allocation_ids: Sequence[int], now: datetime, reason: str) -> int:
    """End allocations and give their device shares back (the trigger frees the devices).
    The ids go as one parameter (`RELEASE_SQL`, `__any`): a cycle releases thousands."""
    if not allocation_ids:
        return 0
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute(RELEASE_SQL, [now, reason[:200], list(allocation_ids)])
            ended = cursor.rowcount
            cursor.execute(RELEASE_SHARES_SQL, [list(allocation_ids)])
        return ended
    ended = Allocation.objects.filter(id__any=allocation_ids, ended_at__isnull=True).update(
        ended_at=now, end_reason=reason[:200]
    )
    AllocationDevice.objects.filter(allocation_id__any=allocation_ids, released=False).update(
        released=True
    )
    return ended


def mark_bound(allocation_ids: Sequence[int], now: datetime) -> None:
    """The allocations' pods are bound (one statement per cycle, its ids as one array)."""
    if not allocation_ids:
        return
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute(
                "UPDATE scheduler_allocation SET bound_at = %s WHERE id = ANY(%s)",
                [now, list(allocation_ids)],
            )
        return
    Allocation.objects.filter(id__any=allocation_ids).update(bound_at=now)


ALLOCATION_COLUMNS = (
    "job_id",
    "node_id",
    "attempt",
    "replica",
    "pod_name",
    "namespace",
    "flavor",
    "gpu_milli",
    "elastic",
    "epoch",
    "started_at",
    "end_reason",
)


def insert_allocations(
    rows: list[tuple[Any, ...]], shares: list[list[tuple[int, int, int]]]
) -> list[int]:
    """Allocation rows (ALLOCATION_COLUMNS) and their device shares; returns the ids. On
    PostgreSQL through COPY with ids drawn from the sequence first (the triggers fire for
    COPY as for INSERT); elsewhere bulk_create."""
    if connection.vendor != "postgresql":
        made = Allocation.objects.bulk_create(
            [Allocation(**dict(zip(ALLOCATION_COLUMNS, r, strict=True))) for r in rows]
        )
        ids = [a.pk for a in made]
        AllocationDevice.objects.bulk_create(
            [
                AllocationDevice(allocation_id=i, device_id=d, milli=m, memory_mib=mem)
                for i, per in zip(ids, shares, strict=True)
                for (d, m, mem) in per
            ]
        )
        return ids
    with connection.cursor() as cursor, connection.wrap_database_errors:
        cursor.execute(
            "SELECT nextval(pg_get_serial_sequence('scheduler_allocation', 'id'))"
            " FROM generate_series(1, %s)",
            [len(rows)],
        )
        ids = [r[0] for r in cursor.fetchall()]
    copy_rows(
        "scheduler_allocation",
        ("id", *ALLOCATION_COLUMNS),
        ((allocation_id, *row) for allocation_id, row in zip(ids, rows, strict=True)),
    )
    copy_rows(
        "scheduler_allocationdevice",
        ("allocation_id", "device_id", "milli", "memory_mib", "released"),
        (
            (allocation_id, device, milli, memory, False)
            for allocation_id, per in zip(ids, shares, strict=True)
            for device, milli, memory in per
        ),
    )
    return ids
