"""How each attempt ended, for the kind of its statement lines: used, preempted or failed.

Read from the job's event history when a statement is made (the allocation's `end_reason` is
overwritten by the release that follows a preemption, so it cannot tell). An allocation's
attempt ended with the first event after its `started_at` that takes the job out of a holding
state (admitted, binding, running):
- to `preempted`: the attempt was preempted;
- to `failed`, or back to `queued` (a failed attempt retried, a bind that failed): failed;
- to `succeeded` or `cancelled`, or no such event yet (still running): used.
"""

from __future__ import annotations

from bisect import bisect_left
from collections import defaultdict
from collections.abc import Iterable
from datetime import datetime

from django.db.models import OuterRef, Subquery

from scheduler.jobs.lifecycle import HOLDING_STATES
from scheduler.models import JobEvent, JobState


class UsageKind:
    USED = "used"
    PREEMPTED = "preempted"
    FAILED = "failed"


ENDING: dict[str, str] = {
    JobState.PREEMPTED: UsageKind.PREEMPTED,
    JobState.FAILED: UsageKind.FAILED,
    JobState.QUEUED: UsageKind.FAILED,
    JobState.SUCCEEDED: UsageKind.USED,
    JobState.CANCELLED: UsageKind.USED,
}


def attempt_kinds(allocations: Iterable[tuple[int, int, datetime]]) -> dict[int, str]:
    """(allocation id, job id, started_at) -> allocation id: kind. One query."""
    allocations = list(allocations)
    endings: dict[int, list[tuple[datetime, str]]] = defaultdict(list)
    rows = (
        JobEvent.objects.filter(
            job_id__in={job_id for _, job_id, _ in allocations},
            from_state__in=HOLDING_STATES,
            to_state__in=list(ENDING),
        )
        .order_by("job_id", "at", "id")
        .values_list("job_id", "at", "to_state")
    )
    for job_id, at, to_state in rows:
        endings[job_id].append((at, ENDING[to_state]))
    kinds: dict[int, str] = {}
    for allocation_id, job_id, started_at in allocations:
        events = endings.get(job_id, [])
        index = bisect_left(events, (started_at, ""))
        kinds[allocation_id] = events[index][1] if index < len(events) else UsageKind.USED
    return kinds


def ending_state(job: str, started_at: str) -> Subquery:
    """The state the attempt of an outer row's allocation ended in, as a subquery (`job` and
    `started_at` name the outer columns): the first event at or after its start that takes
    the job out of a holding state, or NULL while there is none. `ENDING` maps it to the
    kind, as `attempt_kinds` does; SQL that groups by it counts each attempt's kind once per
    row without reading the events into Python."""
    return Subquery(
        JobEvent.objects.filter(
            job_id=OuterRef(job),
            at__gte=OuterRef(started_at),
            from_state__in=HOLDING_STATES,
            to_state__in=list(ENDING),
        )
        .order_by("at", "id")
        .values("to_state")[:1]
    )


def kind_of(state: str | None) -> str:
    """The kind of an attempt that ended in `state` (None: not ended yet, so used)."""
    return UsageKind.USED if state is None else ENDING[state]
