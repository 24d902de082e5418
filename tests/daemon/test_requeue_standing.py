"""Issue 35, item 5: a job preempted and requeued says where it stands. The queue orders a
team's jobs by class, then by when they were queued, and a requeue queues the job anew: the
later submissions of its team and class that wait stand ahead of it, and it says so."""

from __future__ import annotations

from scheduler.models import Job, JobEvent
from tests.daemon.conftest import Env
from tests.daemon.test_history import lender_waits


def requeue_event(job: Job) -> JobEvent:
    return JobEvent.objects.get(job=job, from_state="preempted", to_state="queued")


def test_a_requeued_job_says_it_stands_behind_later_submissions(env: Env) -> None:
    daemon, borrowed, later, _ = lender_waits(env)
    env.run(daemon, seconds=30, cycles=12)  # past the borrowers' minimum runtime
    env.run(daemon, seconds=2, cycles=6)  # the victim's pods go, it is requeued
    [victim] = [j for j in borrowed if JobEvent.objects.filter(job=j, kind="preempted").exists()]
    assert later.created_at > victim.created_at
    event = requeue_event(victim)
    assert event.message.startswith("Back in the queue after preemption (team-alpha reclaims")
    assert event.message.endswith(
        "its place counts from its requeue, so 1 job of its team and class submitted after it "
        "stands ahead of it."
    ), event.message
    assert event.data == {"requeued_after": "preemption"}


def test_without_later_submissions_it_says_none_is_ahead(env: Env) -> None:
    daemon, borrowed, later, _ = lender_waits(env)
    later.delete()
    env.run(daemon, seconds=30, cycles=12)
    env.run(daemon, seconds=2, cycles=6)
    [victim] = [j for j in borrowed if JobEvent.objects.filter(job=j, kind="preempted").exists()]
    assert requeue_event(victim).message.endswith(
        "no job of its team and class submitted after it waits ahead of it."
    )
