"""One path for every job state change (`scheduler.jobs.transitions.transition`): the lifecycle's
table, its timestamps and the reason, the same for one job (`job_transition`, the API's) and
for many (the daemon's), whichever statement writes them."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from scheduler.jobs.approvals import job_request_settle
from scheduler.jobs.lifecycle import TRANSITIONS
from scheduler.jobs.transitions import Change, DisallowedChange, job_transition, transition
from scheduler.models import Job, JobEvent, JobState
from tenants.models import ApprovalKind, ApprovalRequest, ApprovalState
from tests import factories as f

S = JobState
ALLOWED = sorted((a, b) for a, targets in TRANSITIONS.items() for b in targets)
STAMPS = ("state", "reason", "queued_at", "started_at", "finished_at", "updated_at", "not_before")

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def fast_passwords(settings: Any) -> None:
    # Factories hash a password per user; the production hasher would dominate the runtime.
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]


def _jobs(state: str, n: int) -> list[Job]:
    first = f.JobFactory(state=state)
    more = [
        f.JobFactory(state=state, project=first.project, submitted_by=first.submitted_by)
        for _ in range(n - 1)
    ]
    jobs = [first, *more]
    # The same row before the change for every job: what differs after it is the path's doing.
    Job.objects.filter(pk__in=[j.pk for j in jobs]).update(
        reason="before", queued_at=None, started_at=None, finished_at=None
    )
    return jobs


def _stamps(job: Job) -> tuple[Any, ...]:
    row = Job.objects.filter(pk=job.pk).values_list(*STAMPS).get()
    return row


def _job_updates(queries: CaptureQueriesContext) -> list[str]:
    """The statements that update job rows (on PostgreSQL the claim is `WITH moved AS
    (UPDATE ...)`)."""
    table = Job._meta.db_table
    out = []
    for q in queries.captured_queries:
        sql = q["sql"].lstrip()
        if sql.upper().startswith("WITH MOVED AS ("):
            sql = sql[len("WITH moved AS (") :]
        if sql.upper().startswith("UPDATE") and table in sql.split("SET")[0]:
            out.append(q["sql"])
    return out


@pytest.mark.parametrize(
    ("from_state", "to_state"),
    [
        (S.QUEUED, S.RUNNING),
        (S.QUEUED, S.FAILED),
        (S.SUCCEEDED, S.QUEUED),
        (S.ADMITTED, S.RUNNING),
    ],
    ids=lambda s: str(s),
)
def test_the_fast_path_refuses_a_change_the_lifecycle_forbids(
    from_state: str, to_state: str
) -> None:
    """Many jobs from one state to another with one reason is the daemon's one-statement
    path (`set_state_fast` before): it wrote queued -> running without asking the
    lifecycle. The same shape is now a list of Changes, each checked where it is made."""
    jobs = _jobs(from_state, 3)
    before = [_stamps(j) for j in jobs]
    with pytest.raises(DisallowedChange, match=f"{from_state} -> {to_state}"):
        transition([Change(j.pk, (from_state,), to_state) for j in jobs], timezone.now())
    assert [_stamps(j) for j in jobs] == before
    assert not JobEvent.objects.filter(job__in=jobs).exists()


def test_the_daemons_claims_are_one_statement_that_locks_and_writes() -> None:
    """The shape the fast path serves (one from-state, one to-state, one reason, nothing
    else) is one UPDATE that takes its rows' locks itself on PostgreSQL; elsewhere the rows
    are read and then written. Either way the lifecycle's rule holds: see the tests below."""
    jobs = _jobs(S.QUEUED, 3)
    now = timezone.now()
    changes = [Change(j.pk, (S.QUEUED,), S.ADMITTED, message="Admitted.") for j in jobs]
    with CaptureQueriesContext(connection) as seen:
        done = transition(changes, now)
    assert done.done == {j.pk: S.QUEUED for j in jobs}
    updates = _job_updates(seen)
    assert len(updates) == 1, updates
    if connection.vendor == "postgresql":
        assert "FOR UPDATE SKIP LOCKED" in updates[0]
        assert "INSERT INTO scheduler_jobevent" in updates[0]  # the events, in the same one
        assert not [q for q in seen.captured_queries if q["sql"].startswith("SELECT")]
    for job in jobs:
        assert _stamps(job) == (S.ADMITTED, "", None, None, None, now, None)
        [event] = JobEvent.objects.filter(job=job)
        assert (event.kind, event.from_state, event.to_state, event.message, event.data) == (
            "state",
            S.QUEUED,
            S.ADMITTED,
            "Admitted.",
            {},
        )
        assert event.actor_id is None


def test_one_event_for_every_job_is_sent_once_not_as_arrays_of_copies() -> None:
    """A start or an end of many jobs carries the same event for each: the statement sends
    it once (no arrays of copies to build and send), and still only the jobs it moved get
    it, with its data and actor."""
    a, b, c = _jobs(S.QUEUED, 3)
    Job.objects.filter(pk=c.pk).update(state=S.CANCELLED)
    actor = f.UserFactory()
    changes = [
        Change(j.pk, (S.QUEUED,), S.ADMITTED, message="same", data={"n": 1}, actor=actor.pk)
        for j in (a, b, c)
    ]
    with CaptureQueriesContext(connection) as seen:
        done = transition(changes, timezone.now())
    assert set(done.done) == {a.pk, b.pk} and done.moved == {c.pk: S.CANCELLED}
    if connection.vendor == "postgresql":
        [update] = _job_updates(seen)
        assert "INSERT INTO scheduler_jobevent" in update and "unnest" not in update, update
    events = {
        e.job_id: (e.kind, e.from_state, e.to_state, e.message, e.data, e.actor_id)
        for e in JobEvent.objects.filter(job__in=[a, b, c])
    }
    same = ("state", S.QUEUED, S.ADMITTED, "same", {"n": 1}, actor.pk)
    assert events == {a.pk: same, b.pk: same}


def test_each_change_gets_its_own_event_in_the_one_statement() -> None:
    """Messages, kinds, data and actors differ per change within the one statement; only the
    jobs it moved get an event (a job another writer moved first gets none)."""
    a, b, c = _jobs(S.QUEUED, 3)
    Job.objects.filter(pk=c.pk).update(state=S.CANCELLED)
    actor = f.UserFactory()
    changes = [
        Change(a.pk, (S.QUEUED,), S.ADMITTED, message="first", data={"n": 1}),
        Change(b.pk, (S.QUEUED,), S.ADMITTED, message="second", kind="requeued", actor=actor.pk),
        Change(c.pk, (S.QUEUED,), S.ADMITTED, message="third"),
    ]
    done = transition(changes, timezone.now())
    assert set(done.done) == {a.pk, b.pk} and done.moved == {c.pk: S.CANCELLED}
    events = {
        e.job_id: (e.kind, e.message, e.data, e.actor_id)
        for e in JobEvent.objects.filter(job__in=[a, b, c])
    }
    assert events == {
        a.pk: ("state", "first", {"n": 1}, None),
        b.pk: ("requeued", "second", {}, actor.pk),
    }


@pytest.mark.parametrize(("from_state", "to_state"), ALLOWED, ids=[f"{a}->{b}" for a, b in ALLOWED])
def test_one_job_and_many_get_the_same_timestamps_for_the_same_change(
    from_state: str, to_state: str
) -> None:
    """One rule (`job_timestamps`) for every path: the API's one job, the daemon's many in
    one statement, and the daemon's many by groups (a new attempt is not the one statement's:
    the attempt counter is not compared here)."""
    one, *fast, grouped_a, grouped_b = _jobs(from_state, 5)
    now = timezone.now() - timedelta(minutes=5)
    job_transition(job=one, to_state=to_state, now=now, reason="why")
    transition([Change(j.pk, (from_state,), to_state, reason="why") for j in fast], now)
    transition(
        [
            Change(g.pk, (from_state,), to_state, reason="why", new_attempt=True)
            for g in (grouped_a, grouped_b)
        ],
        now,
    )
    expected = _stamps(one)
    assert [_stamps(j) for j in (*fast, grouped_a, grouped_b)] == [expected] * 4
    state, reason, queued_at, started_at, finished_at, updated_at, _ = expected
    assert (state, reason, updated_at) == (to_state, "why", now)
    assert queued_at == (now if to_state == S.QUEUED else None)
    assert started_at == (now if to_state == S.RUNNING else None)
    assert finished_at == (
        now if to_state in {S.SUCCEEDED, S.FAILED, S.CANCELLED, S.REJECTED} else None
    )


def test_a_state_passed_through_gets_the_timestamps_of_both_changes() -> None:
    """A pod seen started and finished at once (binding -> running -> succeeded in one
    write) gets what the two changes one after the other give."""
    twice, once = _jobs(S.BINDING, 2)
    now = timezone.now() - timedelta(minutes=5)
    job_transition(job=twice, to_state=S.RUNNING, now=now)
    job_transition(job=twice, to_state=S.SUCCEEDED, now=now)
    transition([Change(once.pk, (S.BINDING,), S.SUCCEEDED, via=S.RUNNING)], now)
    assert _stamps(once) == _stamps(twice)
    assert _stamps(once)[3:5] == (now, now)  # started and finished


@pytest.mark.parametrize(
    ("from_state", "to_state", "reason"),
    [
        (S.PENDING_APPROVAL, S.REJECTED, "rejected by pat: too large"),
        (S.PENDING_APPROVAL, S.QUEUED, ""),
        (S.RUNNING, S.QUEUED, "attempt 1 failed; retry in 30 s"),
    ],
)
def test_the_reason_is_written_in_the_same_update_as_the_state(
    from_state: str, to_state: str, reason: str
) -> None:
    """An approval decided wrote the job's state, then its reason in a second UPDATE: a
    reader between the two saw a rejected job with the reason it had while it waited."""
    (job,) = _jobs(from_state, 1)
    with CaptureQueriesContext(connection) as seen:
        moved = job_transition(job=job, to_state=to_state, reason=reason, message="decided")
    assert len(_job_updates(seen)) == 1, _job_updates(seen)
    assert (moved.state, moved.reason) == (to_state, reason)
    event = JobEvent.objects.get(job=job)
    assert (event.from_state, event.to_state, event.message) == (from_state, to_state, "decided")


def test_a_change_without_a_reason_clears_the_one_the_job_had() -> None:
    (job,) = _jobs(S.RUNNING, 1)
    assert job_transition(job=job, to_state=S.SUCCEEDED).reason == ""


def test_the_actor_is_recorded_on_the_event_whichever_statement_writes_it() -> None:
    """`job_transition`'s cancel is the one-statement path on PostgreSQL, its events the
    bulk insert (COPY): the user who asked is still on the event."""
    (job,) = _jobs(S.QUEUED, 1)
    job_transition(job=job, to_state=S.CANCELLED, actor=job.submitted_by, message="mine")
    event = JobEvent.objects.get(job=job)
    assert (event.actor_id, event.kind, event.message) == (job.submitted_by_id, "state", "mine")


@pytest.mark.parametrize(
    ("outcome", "state", "reason"),
    [
        (ApprovalState.APPROVED, S.QUEUED, ""),
        (ApprovalState.REJECTED, S.REJECTED, "rejected by {who}: too large"),
        (ApprovalState.EXPIRED, S.REJECTED, "approval expired"),
    ],
)
def test_an_approval_decided_writes_the_jobs_state_and_reason_in_one_update(
    outcome: str, state: str, reason: str
) -> None:
    """The decision moved the job, then wrote its reason in a second UPDATE."""
    (job,) = _jobs(S.PENDING_APPROVAL, 1)
    decider = f.UserFactory()
    request = ApprovalRequest.objects.create(
        kind=ApprovalKind.JOB,
        tenant=job.tenant,
        requester=job.submitted_by,
        subject_id=job.pk,
        comment="too large",
        expires_at=timezone.now() + timedelta(days=1),
    )
    with CaptureQueriesContext(connection) as seen:
        job_request_settle(request=request, outcome=outcome, actor=decider)
    assert len(_job_updates(seen)) == 1, _job_updates(seen)
    row = Job.objects.get(pk=job.pk)
    assert (row.state, row.reason) == (state, reason.format(who=decider.get_username()))
    assert JobEvent.objects.get(job=job).actor_id == decider.pk
