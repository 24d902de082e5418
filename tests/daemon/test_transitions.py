"""Job state changes in bulk (`scheduler.jobs.transitions`) as the daemon makes them."""

from __future__ import annotations

from django.db import connection, transaction
from django.test.utils import CaptureQueriesContext

from scheduler.models import Job
from tests.daemon.conftest import Env


def test_transitions_to_one_state_are_one_update_whatever_their_reasons(env: Env) -> None:
    """Every preempted job carries its own reason; requeueing many is still one UPDATE
    (PostgreSQL), each job with its own reason, backoff and attempt."""
    from datetime import timedelta

    from django.utils import timezone

    from scheduler.jobs.transitions import Change, transition

    jobs = [env.submit() for _ in range(3)]
    Job.objects.filter(pk__in=[j.pk for j in jobs]).update(state="preempted")
    now = timezone.now()
    changes = [
        Change(
            j.pk,
            ("preempted",),
            "queued",
            reason=f"preempted by {i}",
            new_attempt=True,
            not_before=now + timedelta(seconds=i),
        )
        for i, j in enumerate(jobs)
    ]
    with CaptureQueriesContext(connection) as seen, transaction.atomic():
        done = transition(changes, now)
    assert sorted(done.done) == sorted(j.pk for j in jobs)
    updates = [q["sql"] for q in seen.captured_queries if q["sql"].startswith("UPDATE")]
    # Elsewhere (SQLite, the embedded default): one UPDATE per distinct reason and backoff.
    assert len(updates) == (1 if connection.vendor == "postgresql" else 3), updates
    for i, job in enumerate(jobs):
        job.refresh_from_db()
        assert (job.state, job.reason, job.attempt) == ("queued", f"preempted by {i}", 1)
        assert job.not_before == now + timedelta(seconds=i)
        assert job.queued_at == now
