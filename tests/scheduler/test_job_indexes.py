"""Every state change of a job writes an entry in each index of the jobs whose predicate
its new row meets: the indexes serve their readers with as few entries as they need."""

from __future__ import annotations

import pytest
from django.db import connection

from scheduler.models import FINAL_STATES, Job, JobState
from tests.factories import JobFactory, row_columns
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


@pytest.fixture
def history() -> None:
    """A table like a cluster's: two thousand jobs run, a few live in each state, ANALYZEd.
    The planner's choice is then the one it makes on such a table, not one that hangs on the
    statistics an earlier test left (after an ANALYZE of the empty table, a walk of the
    created_at index in the default order costs the same as the partial index and a sort)."""
    columns = row_columns(JobFactory(state=JobState.SUCCEEDED))
    finals = sorted(FINAL_STATES)
    rows = [
        Job(**(columns | {"name": f"done-{n}", "state": finals[n % len(finals)]}))
        for n in range(2000)
    ]
    for state in JobState:
        if state not in FINAL_STATES:
            rows += [Job(**(columns | {"name": f"{state}-{n}", "state": state})) for n in range(5)]
    Job.objects.bulk_create(rows)
    with connection.cursor() as cursor:
        cursor.execute(f"ANALYZE {Job._meta.db_table}")


@pytest.mark.usefixtures("history")
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
