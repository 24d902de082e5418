"""Job state changes in bulk: compare-and-swaps under `scheduler.lifecycle`'s table, with
their events in one write. The daemon's phases and node drains move jobs through here."""

from __future__ import annotations

import functools
import logging
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from django.db import connection
from django.db.models import F
from django.utils import timezone

from scheduler.admission import jobs_final
from scheduler.job_notifications import job_events_notify
from scheduler.lifecycle import is_allowed
from scheduler.models import FINAL_STATES, Job, JobEvent, JobState

log = logging.getLogger("gantry.daemon")
S = JobState


class DisallowedChange(ValueError):
    """A Change the lifecycle forbids from one of its `from_states`: a bug in its caller,
    raised where the Change is made rather than skipped where it is written."""


@functools.cache
def _path_allowed(from_state: str, via: str | None, to_state: str) -> bool:
    path = (from_state, via, to_state) if via else (from_state, to_state)
    return all(map(is_allowed, path, path[1:]))


@dataclass(frozen=True)
class Change:
    """Move job `job_id` from one of `from_states` to `to_state` (a CAS), with its event.
    Every from-state must be allowed to reach `to_state` (through `via`) by the lifecycle,
    or making the Change raises DisallowedChange."""

    job_id: int
    from_states: tuple[str, ...]
    to_state: str
    message: str = ""
    reason: str | None = None  # Job.reason; None keeps lifecycle's default (cleared)
    new_attempt: bool = False
    not_before: datetime | None = None
    kind: str = "state"
    data: dict[str, Any] = field(default_factory=dict)
    # A state passed through in the same write (a pod seen started and finished at once):
    # one UPDATE, both events.
    via: str | None = None
    via_message: str = ""

    def __post_init__(self) -> None:
        for state in self.from_states:
            if not _path_allowed(state, self.via, self.to_state):
                through = f" through {self.via}" if self.via else ""
                raise DisallowedChange(
                    f"job {self.job_id}: the lifecycle does not allow {state} -> "
                    f"{self.to_state}{through}"
                )


@dataclass
class Transitions:
    """What `transition_many` did with each change: `done` (job id -> the state it left),
    `moved` (job id -> the state found, not one the change expected: the compare of the
    compare-and-swap failed, someone changed the job first), `busy` (rows another session
    held locked, or that no longer exist: nothing was written, the change may be tried
    again). Every change lands in exactly one of the three."""

    done: dict[int, str] = field(default_factory=dict)
    moved: dict[int, str] = field(default_factory=dict)
    busy: set[int] = field(default_factory=set)

    @property
    def missed(self) -> set[int]:
        """The changes that were not applied, for whatever reason."""
        return set(self.moved) | self.busy


def transition_many(
    changes: Sequence[Change], now: datetime, versions: dict[int, int] | None = None
) -> Transitions:
    """Apply `changes` as compare-and-swaps in a few statements. Rows another session holds
    locked are skipped (they stay as they are for the next cycle). Must run in a transaction.
    Returns what became of every change (`Transitions`): the caller decides what a missed
    one means, and every miss is logged. `versions`, when given, receives the new row
    versions of the jobs changed (PostgreSQL) for `SnapshotCache.remember`.

    Jobs moving to the same state share one UPDATE (a cycle's changes fall into a handful of
    groups: started, succeeded, requeued...); one bulk insert of events."""
    out = Transitions()
    if not changes:
        return out
    by_id = {c.job_id: c for c in changes}
    locked = Job.objects.select_for_update(skip_locked=True, of=("self",)).filter(
        id__any=list(by_id)
    )
    groups: dict[tuple[Any, ...], list[int]] = defaultdict(list)
    events: list[tuple[Any, ...]] = []
    for job_id, state in locked.values_list("id", "state"):
        change = by_id[job_id]
        if state not in change.from_states:
            out.moved[job_id] = state
            continue
        out.done[job_id] = state
        if change.via:
            events.append((job_id, "state", state, change.via, change.via_message[:1000]))
        before = change.via or state
        events.append(
            (job_id, change.kind, before, change.to_state, change.message[:1000], change.data)
        )
        groups[(change.to_state, change.new_attempt, change.via)].append(job_id)
    out.busy = set(by_id) - out.done.keys() - out.moved.keys()
    for (to_state, new_attempt, via), ids in groups.items():
        written = _update_group([by_id[i] for i in ids], to_state, new_attempt, via, now)
        if versions is not None:
            versions.update(written)
    insert_events(events)
    jobs_final([i for (to, _, _), ids in groups.items() if to in FINAL_STATES for i in ids])
    if out.moved or out.busy:
        log.info(
            "%d of %d job changes not applied: %s",
            len(out.moved) + len(out.busy),
            len(changes),
            "; ".join(
                [
                    *(
                        f"job {i} is {s}, not {'/'.join(by_id[i].from_states)}"
                        for i, s in sorted(out.moved.items())[:10]
                    ),
                    *(f"job {i} locked or gone" for i in sorted(out.busy)[:10]),
                ]
            ),
        )
    return out


def _update_group(
    changes: Sequence[Change], to_state: str, new_attempt: bool, via: str | None, now: datetime
) -> list[tuple[int, int]]:
    """One UPDATE for changes to the same state: reasons and backoffs per job come as arrays
    on PostgreSQL (every preempted job has its own reason); elsewhere one UPDATE per
    distinct reason and backoff. Returns (id, new row version) on PostgreSQL."""
    fields: dict[str, Any] = {"state": to_state, "updated_at": now}
    if to_state == S.QUEUED:
        fields["queued_at"] = now
    elif to_state == S.RUNNING or via == S.RUNNING:
        fields["started_at"] = now
    if to_state in FINAL_STATES:
        fields["finished_at"] = now
    if connection.vendor == "postgresql":
        sets = [f"{name} = %s" for name in fields]
        sets.append("reason = v.reason")
        if to_state == S.QUEUED:
            sets.append("not_before = v.not_before")
        if new_attempt:
            sets.append("attempt = j.attempt + 1")
        sql = (
            f"UPDATE {Job._meta.db_table} AS j SET {', '.join(sets)}"  # noqa: S608 - names are ours
            " FROM unnest(%s::bigint[], %s::text[], %s::timestamptz[]) AS v(id, reason, not_before)"
            " WHERE j.id = v.id RETURNING j.id, j.xmin::text::bigint"
        )
        params = [
            *fields.values(),
            [c.job_id for c in changes],
            [(c.reason or "")[:500] for c in changes],
            [c.not_before for c in changes],
        ]
        with connection.cursor() as cursor:
            cursor.execute(sql, params)
            return cursor.fetchall()
    same: dict[tuple[str, datetime | None], list[int]] = defaultdict(list)
    for c in changes:
        same[((c.reason or "")[:500], c.not_before)].append(c.job_id)
    for (reason, not_before), ids in same.items():
        extra: dict[str, Any] = {"reason": reason}
        if to_state == S.QUEUED:
            extra["not_before"] = not_before
        if new_attempt:
            extra["attempt"] = F("attempt") + 1
        Job.objects.filter(id__in=ids).update(**fields, **extra)
    return []


# The compare-and-swaps below find their rows by primary key and only then test the state,
# written `state || '' = %s` so that no index on the state can serve it. Written plainly,
# the planner may take the partial index of queued jobs (`job_queue_heads`) or the
# (state, queued_at) one, whose size it knows only from the last ANALYZE: after a burst of
# submissions it reads every queued job to find the hundred it writes (twice the time of
# the whole UPDATE in bench.daemon_drain).
CLAIM_SQL = (
    "UPDATE scheduler_job SET state = %s, reason = %s, updated_at = %s{started}"
    " WHERE id IN (SELECT id FROM scheduler_job WHERE id = ANY(%s) AND state || '' = %s"
    " FOR UPDATE SKIP LOCKED) RETURNING id, xmin::text::bigint"
)


def set_state_fast(
    ids: Iterable[int],
    from_state: str,
    to_state: str,
    now: datetime,
    message: str,
    reason: str = "",
    versions: dict[int, int] | None = None,
) -> list[int]:
    """The hot path of a CAS for many jobs in one state: lock what is free and update it (one
    statement on PostgreSQL), then the events in one COPY. Must run in a transaction.
    `versions`, when given, receives the new row versions (PostgreSQL) for
    `SnapshotCache.remember`."""
    ids = list(ids)
    if not ids:
        return []
    started = ", started_at = %s" if to_state == S.RUNNING else ""
    if connection.vendor == "postgresql":
        sql = CLAIM_SQL.format(started=started)
        params: list[Any] = [to_state, reason, now, *([now] if started else []), ids, from_state]
        with connection.cursor() as cursor:
            cursor.execute(sql, params)
            written = cursor.fetchall()
        claimed = [row[0] for row in written]
        if versions is not None:
            versions.update(written)
    else:
        claimed = list(
            Job.objects.filter(id__in=ids, state=from_state).values_list("id", flat=True)
        )
        extra: dict[str, Any] = {"started_at": now} if started else {}
        Job.objects.filter(id__in=claimed).update(
            state=to_state, reason=reason, updated_at=now, **extra
        )
    insert_events([(i, "state", from_state, to_state, message) for i in claimed])
    return claimed


def insert_events(rows: Sequence[tuple[Any, ...]]) -> None:
    """JobEvent rows (job id, kind, from, to, message[, data]): COPY on PostgreSQL. The
    notable ones (started, finished...) also go to the notification outbox, in the same
    transaction."""
    if not rows:
        return
    job_events_notify(rows)
    if connection.vendor != "postgresql":
        JobEvent.objects.bulk_create(
            [
                JobEvent(
                    job_id=r[0],
                    kind=r[1],
                    from_state=r[2],
                    to_state=r[3],
                    message=r[4],
                    data=r[5] if len(r) > 5 else {},
                )
                for r in rows
            ],
            batch_size=2000,
        )
        return
    from psycopg.types.json import Jsonb

    columns = "job_id, at, kind, from_state, to_state, message, data"
    at = timezone.now()  # as auto_now_add would: event times are wall time
    sql = f"COPY scheduler_jobevent ({columns}) FROM STDIN"
    with (
        connection.cursor() as cursor,
        connection.wrap_database_errors,
        cursor.cursor.copy(sql) as copy,
    ):
        for row in rows:
            data = Jsonb(row[5] if len(row) > 5 else {})
            copy.write_row((row[0], at, row[1], row[2], row[3], row[4][:1000], data))
