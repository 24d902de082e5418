"""Job state changes: compare-and-swaps under `scheduler.jobs.lifecycle`'s table, with its
timestamps, the reason and the events, for one job or many (`transition`). Every path that
changes a job's state goes through here: the daemon's phases, node drains, and a user's or an
approval's change of one job (`job_transition`)."""

from __future__ import annotations

import functools
import json
import logging
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Literal

from django.db import connection, transaction
from django.db.models import F
from django.utils import timezone

from common.db.bulk import copy_rows
from common.errors import ConflictError
from scheduler.jobs.hooks import jobs_final
from scheduler.jobs.lifecycle import is_allowed
from scheduler.jobs.notifications import job_events_notify
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


@dataclass(slots=True)
class Change:
    """Move job `job_id` from one of `from_states` to `to_state` (a CAS), with its event.
    Every from-state must be allowed to reach `to_state` (through `via`) by the lifecycle,
    or making the Change raises DisallowedChange. Made and handed to `transition` at once,
    never kept or hashed: a plain class with slots, as a cycle makes one per job per step
    (a frozen dataclass's `__init__` sets each field through `object.__setattr__`)."""

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
    actor: int | None = None  # the user who asked for it, on its events

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
    """What `transition` did with each change: `done` (job id -> the state it left),
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


def job_timestamps(to_state: str, now: datetime, via: str | None = None) -> dict[str, Any]:
    """The lifecycle's timestamps of a job entering `to_state` (through `via`) at `now`: the
    one rule every path writes."""
    stamps: dict[str, Any] = {}
    if to_state == S.QUEUED:
        stamps["queued_at"] = now
    elif S.RUNNING in (to_state, via):
        stamps["started_at"] = now
    if to_state in FINAL_STATES:
        stamps["finished_at"] = now
    return stamps


def transition(
    changes: Sequence[Change],
    now: datetime,
    *,
    versions: dict[int, int] | None = None,
    lock: Literal["skip", "wait"] = "skip",
) -> Transitions:
    """Apply `changes` as compare-and-swaps under the lifecycle's table (every `Change` is
    checked where it is made), with its timestamps (`job_timestamps`), its reason and its
    events, in a few statements and one transaction. The one path of every job state change.

    `lock="skip"` (the daemon) leaves rows another session holds locked as they are, for the
    next cycle (`busy`); `lock="wait"` (a user's request) waits for them and then compares.
    Returns what became of every change (`Transitions`): the caller decides what a missed
    one means, and every miss is logged. `versions`, when given, receives the new row
    versions of the jobs changed (PostgreSQL) for `SnapshotCache.remember`.

    Jobs moving to the same state share one UPDATE (a cycle's changes fall into a handful of
    groups: started, succeeded, requeued...); one bulk insert of events. On PostgreSQL,
    changes from one state to another with one reason and nothing else to write (the
    daemon's claims and binds, a user's cancel) are one statement that locks, writes and
    records their events."""
    out = Transitions()
    if not changes:
        return out
    by_id = {c.job_id: c for c in changes}
    with transaction.atomic(savepoint=False):
        events: list[tuple[Any, ...]] = []
        # One statement on PostgreSQL writes the jobs and their events (`_claim`).
        claimed = connection.vendor == "postgresql" and _one_statement(changes)
        if claimed:
            final = _claim(by_id, now, lock, versions, out)
        else:
            final = _compare_and_swap(by_id, now, lock, versions, out)
        for job_id in out.done:
            change = by_id[job_id]
            before = out.done[job_id]
            if change.via:
                via_message = change.via_message[:1000]
                events.append((job_id, "state", before, change.via, via_message, {}, change.actor))
                before = change.via
            events.append(
                (
                    job_id,
                    change.kind,
                    before,
                    change.to_state,
                    change.message[:1000],
                    change.data,
                    change.actor,
                )
            )
        if claimed:
            job_events_notify(events)  # written with the jobs; notified here, as below
        else:
            insert_events(events)
        jobs_final(final)
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


def _one_statement(changes: Sequence[Change]) -> bool:
    """Can `changes` be one lock-and-write statement (`CLAIM_SQL`)? From one state to one
    other, one reason, nothing else to write."""
    first = changes[0]
    return len(first.from_states) == 1 and all(
        c.from_states == first.from_states
        and c.to_state == first.to_state
        and c.reason == first.reason
        and c.via is None
        and not c.new_attempt
        and c.not_before is None
        for c in changes
    )


def _claim(
    by_id: dict[int, Change],
    now: datetime,
    lock: str,
    versions: dict[int, int] | None,
    out: Transitions,
) -> list[int]:
    """The changes (`_one_statement`) and their events as one statement (`CLAIM_SQL` and
    `EVENTS_SQL`); PostgreSQL. Fills `out`; returns the jobs made final."""
    changes = list(by_id.values())
    first = changes[0]
    (from_state,) = first.from_states
    fields = {**job_timestamps(first.to_state, now)}
    if first.to_state == S.QUEUED:
        fields["not_before"] = None
    sql = CLAIM_SQL.format(
        sets="".join(f", {name} = %s" for name in fields),
        skip=" SKIP LOCKED" if lock == "skip" else "",
    )
    ids = [c.job_id for c in changes]
    params = [first.to_state, (first.reason or "")[:500], now, *fields.values(), ids, from_state]
    at = timezone.now()  # as insert_events: event times are wall time
    event = (first.kind, first.message, first.data, first.actor)
    if all((c.kind, c.message, c.data, c.actor) == event for c in changes):
        # One event for every job (a start, an end): written once, not as arrays of copies.
        events = EVENT_SQL
        params += [at, first.kind, from_state, first.to_state, first.message[:1000]]
        params += [json.dumps(first.data), first.actor]
    else:
        events = EVENTS_SQL
        params += [at, from_state, first.to_state, ids, [c.kind for c in changes]]
        params += [[c.message[:1000] for c in changes], [json.dumps(c.data) for c in changes]]
        params += [[c.actor for c in changes]]
    sql = f"WITH moved AS ({sql}), events AS ({events}) SELECT id, version FROM moved"  # noqa: S608 - ours
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        written = cursor.fetchall()
    if versions is not None:
        versions.update(written)
    out.done = {row[0]: from_state for row in written}
    missed = [i for i in ids if i not in out.done]
    if missed:  # which were moved by someone else, which are locked or gone
        for job_id, state in Job.objects.filter(id__any=missed).values_list("id", "state"):
            if state != from_state:
                out.moved[job_id] = state
        out.busy = set(missed) - out.moved.keys()
    return list(out.done) if first.to_state in FINAL_STATES else []


def _compare_and_swap(
    by_id: dict[int, Change],
    now: datetime,
    lock: str,
    versions: dict[int, int] | None,
    out: Transitions,
) -> list[int]:
    """Lock the rows, compare their states, write the changes that hold by groups
    (`_update_group`). Fills `out`; returns the jobs made final."""
    locked = Job.objects.select_for_update(skip_locked=lock == "skip", of=("self",)).filter(
        id__any=list(by_id)
    )
    groups: dict[tuple[Any, ...], list[int]] = defaultdict(list)
    for job_id, state in locked.values_list("id", "state"):
        change = by_id[job_id]
        if state not in change.from_states:
            out.moved[job_id] = state
            continue
        out.done[job_id] = state
        groups[(change.to_state, change.new_attempt, change.via)].append(job_id)
    out.busy = set(by_id) - out.done.keys() - out.moved.keys()
    for (to_state, new_attempt, via), ids in groups.items():
        written = _update_group([by_id[i] for i in ids], to_state, new_attempt, via, now)
        if versions is not None:
            versions.update(written)
    return [i for (to, _, _), ids in groups.items() if to in FINAL_STATES for i in ids]


def _update_group(
    changes: Sequence[Change], to_state: str, new_attempt: bool, via: str | None, now: datetime
) -> list[tuple[int, int]]:
    """One UPDATE for changes to the same state: reasons and backoffs per job come as arrays
    on PostgreSQL (every preempted job has its own reason); elsewhere one UPDATE per
    distinct reason and backoff. Returns (id, new row version) on PostgreSQL."""
    fields: dict[str, Any] = {"state": to_state, "updated_at": now}
    fields.update(job_timestamps(to_state, now, via))
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


# The compare-and-swap below finds its rows by primary key and only then tests the state,
# written `state || '' = %s` so that no index on the state can serve it. Written plainly,
# the planner may take the partial index of queued jobs (`job_queue_heads`) or the
# (state, queued_at) one, whose size it knows only from the last ANALYZE: after a burst of
# submissions it reads every queued job to find the hundred it writes (twice the time of
# the whole UPDATE in bench.daemon_drain). `{sets}`: the lifecycle's timestamps;
# `{skip}`: " SKIP LOCKED" or nothing (`transition`'s `lock`).
CLAIM_SQL = (
    "UPDATE scheduler_job SET state = %s, reason = %s, updated_at = %s{sets}"
    " WHERE id IN (SELECT id FROM scheduler_job WHERE id = ANY(%s) AND state || '' = %s"
    " FOR UPDATE{skip}) RETURNING id, xmin::text::bigint AS version"
)
# With CLAIM_SQL as `moved`: the event of each job it moved, in the same statement (a COPY
# of the events was two more round trips). Per change: kind, message, data, actor.
EVENTS_SQL = (
    "INSERT INTO scheduler_jobevent (job_id, at, kind, from_state, to_state, message, data,"
    " actor_id) SELECT m.id, %s, v.kind, %s, %s, v.message, v.data::jsonb, v.actor"
    " FROM moved m JOIN unnest(%s::bigint[], %s::text[], %s::text[], %s::text[], %s::int[])"
    " AS v(id, kind, message, data, actor) ON v.id = m.id"
)
# The same with one event for every job moved: at, kind, from, to, message, data, actor.
EVENT_SQL = (
    "INSERT INTO scheduler_jobevent (job_id, at, kind, from_state, to_state, message, data,"
    " actor_id) SELECT m.id, %s, %s, %s, %s, %s, %s::jsonb, %s::int FROM moved m"
)


@transaction.atomic
def job_transition(
    *,
    job: Job,
    to_state: str,
    actor: Any = None,
    message: str = "",
    kind: str = "state",
    data: dict[str, Any] | None = None,
    new_attempt: bool = False,
    reason: str | None = None,
    now: datetime | None = None,
) -> Job:
    """Move `job` from the state it was read in to `to_state` (`transition` for one job,
    waiting for its row), or raise ConflictError: the API's 409.

    `job.state` is the expected current state (the compare of the compare-and-swap).
    `new_attempt` raises the attempt counter (a requeue after preemption or a failed
    attempt); `reason` is written with the state (None clears it).
    """
    from_state = job.state
    try:
        change = Change(
            job.pk,
            (from_state,),
            to_state,
            message=message,
            reason=reason,
            new_attempt=new_attempt,
            kind=kind,
            data=data or {},
            actor=actor.pk if getattr(actor, "is_authenticated", False) else None,
        )
    except DisallowedChange as error:
        raise ConflictError(f"A job cannot go from {from_state} to {to_state}.") from error
    result = transition([change], now or timezone.now(), lock="wait")
    if job.pk not in result.done:
        current = result.moved.get(job.pk, "gone")
        raise ConflictError(f"Job {job.pk} is {current}, not {from_state}; nothing was changed.")
    job.refresh_from_db()
    return job


def insert_events(rows: Sequence[tuple[Any, ...]]) -> None:
    """JobEvent rows (job id, kind, from, to, message[, data[, actor id]]): COPY on
    PostgreSQL. The notable ones (started, finished...) also go to the notification outbox,
    in the same transaction."""
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
                    actor_id=r[6] if len(r) > 6 else None,
                )
                for r in rows
            ],
            batch_size=2000,
        )
        return
    from psycopg.types.json import Jsonb

    columns = ("job_id", "at", "kind", "from_state", "to_state", "message", "data", "actor_id")
    at = timezone.now()  # as auto_now_add would: event times are wall time
    copy_rows(
        "scheduler_jobevent",
        columns,
        (
            (
                row[0],
                at,
                row[1],
                row[2],
                row[3],
                row[4][:1000],
                Jsonb(row[5] if len(row) > 5 else {}),
                row[6] if len(row) > 6 else None,
            )
            for row in rows
        ),
    )
