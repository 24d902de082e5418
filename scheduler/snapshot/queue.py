"""The queue window: which queued jobs the engine sees in a cycle."""

from __future__ import annotations

import functools
import logging
from typing import Any

from django.db import connection
from django.db.models import F, Window
from django.db.models.functions import RowNumber

from scheduler.models import (
    Job,
    JobState,
)
from tenants.models import PriorityClass as PriorityClassRow
from tenants.models import Tenant

log = logging.getLogger("gantry.daemon")
S = JobState


# The state is in the text, not a value: a plan made for any value (the generic plan that
# the daemon's sessions may keep, `scheduler.leader.DAEMON_PLAN_CACHE_MODE`) could not use
# the partial index of queued jobs (job_queue_heads) and would read every queued job.
HEADS_SQL = (
    "SELECT h.id, h.version, h.place FROM {tenant} t CROSS JOIN {pclass} pc CROSS JOIN LATERAL ("
    " SELECT j.id, j.xmin::text::bigint AS version, j.queued_at,"
    " row_number() OVER (ORDER BY j.queued_at, j.id) AS place"
    " FROM {job} j WHERE j.tenant_id = t.id AND j.priority_class_id = pc.id"
    " AND j.state = '{queued}'"
    " ORDER BY j.queued_at, j.id LIMIT %s) h"
    " ORDER BY h.place, pc.value DESC, h.queued_at, h.id LIMIT %s"
)


@functools.cache
def _heads_sql() -> str:
    return HEADS_SQL.format(
        tenant=Tenant._meta.db_table,
        pclass=PriorityClassRow._meta.db_table,
        job=Job._meta.db_table,
        queued=S.QUEUED.value,
    )


def queue_heads(
    max_pending: int, per_queue: int, seen: dict[tuple[int, int], int] | None = None
) -> list[tuple[int, int]]:
    """(id, version) of the jobs in the window `_queue` describes, on PostgreSQL: one index
    probe per queue (job_queue_heads), each reading only as deep as the round-robin can
    reach. With Q queues holding jobs, a window of `max_pending` takes about
    `max_pending / Q` from each; reading `per_queue` from every queue to keep 500 of
    thousands was most of a quiet cycle's database time.

    Reading the first L of each queue (L <= `per_queue`) gives the same window whenever it
    yields `max_pending` jobs (every job it leaves out is deeper than L in its queue, so
    it comes after all it read in the round-robin order) or no queue had L jobs to give
    (nothing was left out). Otherwise it reads again at the full depth. L is sized from the number
    of queues the previous read found (`seen`, per window shape), with room for queues that
    run dry."""
    shape = (max_pending, per_queue)
    seen = seen if seen is not None else {}
    queues = seen.get(shape)
    depth = per_queue if queues is None else min(per_queue, -(-max_pending * 5 // (4 * queues)) + 1)
    with connection.cursor() as cursor:
        while True:
            cursor.execute(_heads_sql(), (depth, max_pending))
            rows = cursor.fetchall()
            deepest = max((place for _, _, place in rows), default=0)
            if len(rows) >= max_pending or deepest < depth or depth >= per_queue:
                break
            depth = per_queue
    seen[shape] = max(1, sum(1 for _, _, place in rows if place == 1))
    return [(job_id, version) for job_id, version, _ in rows]


def _queue(max_pending: int, per_queue: int) -> Any:
    """The queued jobs the engine sees. Without `per_queue`: the first `max_pending` by
    priority, then age. With it: each queue's (tenant x priority class) first `per_queue` by
    age, and when those are more than `max_pending`, taken round-robin across the queues
    (every queue's first job, then every queue's second...). A window by priority alone
    fills up with high-priority jobs that cannot fit (say 5 GPUs, where nodes have 3 left)
    and hides the small jobs that could use the gaps; the engine orders what it sees.
    (On PostgreSQL the per-queue window is read by `queue_heads`.)"""
    queued = Job.objects.filter(state=S.QUEUED)
    if not per_queue:
        first = queued.order_by(-F("priority_class__value"), "queued_at", "id")
        return Job.objects.filter(id__in=first.values("id")[:max_pending])
    place = Window(
        RowNumber(),
        partition_by=[F("tenant_id"), F("priority_class_id")],
        order_by=[F("queued_at").asc(), F("id").asc()],
    )
    heads = (
        queued.annotate(place=place)
        .filter(place__lte=per_queue)
        .order_by("place", -F("priority_class__value"), "queued_at", "id")
        .values("id")[:max_pending]
    )
    return Job.objects.filter(id__in=heads)
