"""The daemon's bulk writes other than state changes (`scheduler.transitions`): waiting
reasons, allocations with their device shares, and releases."""

from __future__ import annotations

import logging
from collections import defaultdict
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

from django.db import connection

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


# Allocation rows and their device shares in one statement: ids drawn from the sequence
# once per row (a CTE referenced three times is computed once), the shares joined to their
# allocation by the row's position. The triggers fire as for any INSERT.
_COLUMNS = ", ".join(ALLOCATION_COLUMNS)
INSERT_ALLOCATIONS_SQL = (
    "WITH new AS (SELECT nextval(pg_get_serial_sequence('scheduler_allocation', 'id')) AS id,"  # noqa: S608 - the names are ours
    " r.* FROM unnest(%s::bigint[], %s::bigint[], %s::int[], %s::int[], %s::text[],"
    " %s::text[], %s::text[], %s::int[], %s::boolean[], %s::bigint[], %s::timestamptz[],"
    f" %s::text[]) WITH ORDINALITY AS r({_COLUMNS}, n)),"
    f" a AS (INSERT INTO scheduler_allocation (id, {_COLUMNS}) SELECT id, {_COLUMNS} FROM new),"
    " s AS (INSERT INTO scheduler_allocationdevice"
    " (allocation_id, device_id, milli, memory_mib, released)"
    " SELECT new.id, s.device, s.milli, s.memory, false FROM new JOIN"
    " unnest(%s::bigint[], %s::bigint[], %s::int[], %s::int[]) AS s(n, device, milli, memory)"
    " ON s.n + 1 = new.n)"
    " SELECT id FROM new ORDER BY n"
)


def insert_allocations(
    rows: list[tuple[Any, ...]], shares: list[list[tuple[int, int, int]]]
) -> list[int]:
    """Allocation rows (ALLOCATION_COLUMNS) and their device shares; returns the ids, in
    the rows' order. On PostgreSQL one statement (INSERT_ALLOCATIONS_SQL); elsewhere
    bulk_create."""
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
    # Column by column, as arrays: the rows', then the shares' (the row's position first).
    arrays: list[list[Any]] = [list(c) for c in zip(*rows, strict=True)]
    numbered = [(n, *share) for n, per in enumerate(shares) for share in per]
    arrays += [list(c) for c in zip(*numbered, strict=True)] if numbered else [[], [], [], []]
    with connection.cursor() as cursor:
        cursor.execute(INSERT_ALLOCATIONS_SQL, arrays)
        return [r[0] for r in cursor.fetchall()]
