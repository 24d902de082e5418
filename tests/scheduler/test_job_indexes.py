"""Every state change of a job writes an entry in each index of the jobs whose predicate
its new row meets: the indexes serve their readers with as few entries as they need."""

from __future__ import annotations

import pytest
from django.db import connection

from scheduler.models import FINAL_STATES, Job, JobState
from tests.plans import index_plan

pytestmark = [pytest.mark.django_db, pytest.mark.postgresql("index definitions and plans")]


def test_the_index_by_state_holds_live_jobs_only() -> None:
    """A job's last update (to a final state) writes no entry in job_queue_order."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT indexdef FROM pg_indexes WHERE indexname = 'job_queue_order'")
        (definition,) = cursor.fetchone()
    assert " WHERE " in definition
    for state in JobState:
        assert (f"'{state.value}'" in definition) == (state not in FINAL_STATES), definition


@pytest.mark.parametrize(
    "states",
    [
        (JobState.QUEUED,),
        (JobState.ADMITTED,),
        (JobState.PREEMPTED,),
        (JobState.PENDING_APPROVAL, JobState.QUEUED),
    ],
)
def test_the_readers_by_live_state_use_it(states: tuple[str, ...]) -> None:
    """The daemon's sweeps (admitted, preempted), the queue's counts and the waiting jobs
    are read by a partial index (job_queue_order, or the queue heads' for queued jobs),
    not by a scan of every job ever run."""
    plan = index_plan(Job.objects.filter(state__in=states).values("id"))
    assert "job_queue_order" in plan or "job_queue_heads" in plan, plan
    assert "Seq Scan" not in plan, plan
