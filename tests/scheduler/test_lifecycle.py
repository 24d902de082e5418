"""The job state machine: every (from, to) pair, cancel, and races on one job.

The expected table is written out here on purpose, not read from `scheduler.jobs.lifecycle`, so that
a change to the product's TRANSITIONS table shows up as a failing test to be argued about.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import pytest

from common.errors import ConflictError
from scheduler.jobs.services import job_cancel
from scheduler.jobs.transitions import job_transition
from scheduler.models import Job, JobEvent, JobState
from tests import factories as f
from tests.concurrency import run_in_threads

S = JobState
FINAL = {S.SUCCEEDED, S.FAILED, S.CANCELLED, S.REJECTED}

# ARCHITECTURE.md "Job lifecycle": pending_approval -> queued -> admitted -> binding -> running
# -> succeeded | failed | cancelled, running -> preempted -> queued; cancel from every non-final
# state. Plus the recovery edges the engine needs: a claim released before anything ran
# (admitted/binding -> queued), a bind that fails for good (admitted/binding -> failed), a failed
# attempt retried (running -> queued), an approval refused (pending_approval -> rejected), and
# preemption or drain from every state that holds devices (admitted/binding/running -> preempted),
# and a user's Kubernetes object that completed as its job was preempted (queued/preempted ->
# succeeded: its pods finished before they were stopped).
ALLOWED: set[tuple[str, str]] = {
    (S.PENDING_APPROVAL, S.QUEUED),
    (S.PENDING_APPROVAL, S.REJECTED),
    (S.PENDING_APPROVAL, S.CANCELLED),
    (S.QUEUED, S.ADMITTED),
    (S.QUEUED, S.SUCCEEDED),
    (S.QUEUED, S.CANCELLED),
    (S.ADMITTED, S.BINDING),
    (S.ADMITTED, S.QUEUED),
    (S.ADMITTED, S.FAILED),
    (S.ADMITTED, S.PREEMPTED),
    (S.ADMITTED, S.CANCELLED),
    (S.BINDING, S.RUNNING),
    (S.BINDING, S.QUEUED),
    (S.BINDING, S.FAILED),
    (S.BINDING, S.PREEMPTED),
    (S.BINDING, S.CANCELLED),
    (S.RUNNING, S.SUCCEEDED),
    (S.RUNNING, S.FAILED),
    (S.RUNNING, S.PREEMPTED),
    (S.RUNNING, S.QUEUED),
    (S.RUNNING, S.CANCELLED),
    (S.PREEMPTED, S.QUEUED),
    (S.PREEMPTED, S.SUCCEEDED),
    (S.PREEMPTED, S.CANCELLED),
}
ALL_PAIRS = [(a, b) for a in S for b in S]  # 10 x 10 = 100 pairs, self-loops included
NON_FINAL = [s for s in S if s not in FINAL]


@pytest.fixture(autouse=True)
def fast_passwords(settings: Any) -> None:
    # Factories hash a password per user; the production hasher would dominate the runtime.
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]


def _snapshot(job: Job) -> tuple[str, int, Any, Any, Any, int]:
    row = Job.objects.get(pk=job.pk)
    return (
        row.state,
        row.events.count(),
        row.queued_at,
        row.started_at,
        row.finished_at,
        row.attempt,
    )


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("from_state", "to_state"), ALL_PAIRS, ids=[f"{a}->{b}" for a, b in ALL_PAIRS]
)
def test_every_transition_pair(from_state: str, to_state: str) -> None:
    job = f.JobFactory(state=from_state)
    actor = job.submitted_by
    before = _snapshot(job)
    if (from_state, to_state) in ALLOWED:
        moved = job_transition(job=job, to_state=to_state, actor=actor, message="test")
        assert moved.state == to_state
        assert Job.objects.get(pk=job.pk).state == to_state
        events = list(JobEvent.objects.filter(job=job))
        assert len(events) == 1, events  # the job had no events; exactly one is written
        event = events[0]
        assert (event.from_state, event.to_state, event.kind) == (from_state, to_state, "state")
        assert event.actor == actor
        row = Job.objects.get(pk=job.pk)
        if to_state == S.QUEUED:
            assert row.queued_at is not None
        if to_state == S.RUNNING:
            assert row.started_at is not None
        if to_state in FINAL:
            assert row.finished_at is not None
    else:
        with pytest.raises(ConflictError, match=f"from {from_state} to {to_state}"):
            job_transition(job=job, to_state=to_state, actor=actor)
        assert _snapshot(job) == before  # same state, no event, no timestamp touched


def test_allowed_table_has_cancel_from_every_non_final_state() -> None:
    # A guard on the table above: 6 non-final states, each with an edge to cancelled.
    assert {a for a, b in ALLOWED if b == S.CANCELLED} == set(NON_FINAL)
    assert not {a for a, _ in ALLOWED} & FINAL


@pytest.mark.django_db
def test_requeue_with_new_attempt_raises_the_attempt_counter() -> None:
    job = f.JobFactory(state=S.PREEMPTED, attempt=2)
    job = job_transition(job=job, to_state=S.QUEUED, new_attempt=True)
    assert (job.state, job.attempt) == (S.QUEUED, 3)  # 2 + 1


@pytest.mark.django_db
@pytest.mark.parametrize("state", NON_FINAL)
def test_cancel_from_every_non_final_state(state: str) -> None:
    job = f.JobFactory(state=state)
    cancelled = job_cancel(user=job.submitted_by, job=job, reason="no longer needed")
    assert Job.objects.get(pk=job.pk).state == S.CANCELLED == cancelled.state
    event = JobEvent.objects.get(job=job)
    assert (event.from_state, event.to_state) == (state, S.CANCELLED)
    assert "no longer needed" in event.message


@pytest.mark.django_db
@pytest.mark.parametrize("state", sorted(FINAL))
def test_cancel_from_a_final_state_is_refused(state: str) -> None:
    job = f.JobFactory(state=state)
    with pytest.raises(ConflictError, match=f"already {state}"):
        job_cancel(user=job.submitted_by, job=job)
    assert Job.objects.get(pk=job.pk).state == state
    assert not JobEvent.objects.filter(job=job).exists()


@pytest.mark.django_db
def test_stale_read_fails_the_compare_and_swap() -> None:
    job = f.JobFactory(state=S.QUEUED)
    stale = Job.objects.get(pk=job.pk)  # read while queued
    job_transition(job=job, to_state=S.ADMITTED)  # meanwhile the scheduler admits it
    job_transition(job=job, to_state=S.CANCELLED)  # ... and the user cancels it
    # The stale copy still says queued, and queued -> admitted is an allowed edge, so only the
    # compare-and-swap in the UPDATE can refuse it.
    with pytest.raises(ConflictError, match=f"Job {job.pk} is cancelled, not queued"):
        job_transition(job=stale, to_state=S.ADMITTED)
    assert Job.objects.get(pk=job.pk).state == S.CANCELLED
    assert list(JobEvent.objects.filter(job=job).values_list("from_state", "to_state")) == [
        (S.QUEUED, S.ADMITTED),
        (S.ADMITTED, S.CANCELLED),
    ]


@pytest.mark.django_db
def test_cancel_with_a_stale_copy_rereads_and_cancels() -> None:
    job = f.JobFactory(state=S.QUEUED)
    stale = Job.objects.get(pk=job.pk)
    job_transition(job=job, to_state=S.ADMITTED)
    job_transition(job=job, to_state=S.BINDING)
    job_cancel(user=job.submitted_by, job=stale)
    assert Job.objects.get(pk=job.pk).state == S.CANCELLED
    assert JobEvent.objects.filter(job=job).last().from_state == S.BINDING


@pytest.mark.django_db
def test_cancel_with_a_stale_copy_of_a_finished_job_is_refused() -> None:
    job = f.JobFactory(state=S.RUNNING)
    stale = Job.objects.get(pk=job.pk)
    job_transition(job=job, to_state=S.SUCCEEDED)
    with pytest.raises(ConflictError, match="already succeeded"):
        job_cancel(user=job.submitted_by, job=stale)
    assert Job.objects.get(pk=job.pk).state == S.SUCCEEDED
    assert JobEvent.objects.filter(job=job).count() == 1


# --- races --------------------------------------------------------------------------------


RACES = [
    pytest.param(S.ADMITTED, S.BINDING, S.CANCELLED, id="bind-vs-cancel"),
    pytest.param(S.RUNNING, S.SUCCEEDED, S.PREEMPTED, id="succeed-vs-preempt"),
    pytest.param(S.QUEUED, S.ADMITTED, S.ADMITTED, id="double-admit"),
]


@pytest.mark.parametrize(("start", "first", "second"), RACES)
def test_two_concurrent_transitions_have_one_winner(
    transactional_db: Any,
    start: str,
    first: str,
    second: str,
) -> None:
    job = f.JobFactory(state=start)
    barrier = threading.Barrier(2, timeout=10)

    def move(to_state: str) -> Callable[[], Job]:
        def call() -> Job:
            mine = Job.objects.get(pk=job.pk)  # each thread reads the job in `start` ...
            barrier.wait()  # ... and only then does either write: the losing interleaving
            return job_transition(job=mine, to_state=to_state)

        return call

    results = run_in_threads(move(first), move(second))
    winners = [value for kind, value in results if kind == "ok"]
    losers = [value for kind, value in results if kind == "error"]
    assert len(winners) == 1, results
    assert len(losers) == 1 and isinstance(losers[0], ConflictError), results
    assert f"not {start}" in str(losers[0])
    final = Job.objects.get(pk=job.pk)
    assert final.state == winners[0].state
    events = list(JobEvent.objects.filter(job=job).values_list("from_state", "to_state"))
    assert events == [(start, final.state)]  # one event, from the winner
