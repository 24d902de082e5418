"""The daemon's sessions let PostgreSQL keep a generic plan of a statement it prepared
(`scheduler.leader.DAEMON_PLAN_CACHE_MODE`), where the web's plan every execution for its
values. The daemon's statements that read through a partial index name what they filter on
in their text, so a generic plan can use the index too; a statement that passes a state as
a value keeps plans for its values on a table with a history."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import timedelta
from typing import Any

import pytest
from django.db import connection
from django.utils import timezone

from scheduler.leader import daemon_sessions
from scheduler.models import FINAL_STATES, Job, JobEvent, JobState
from scheduler.snapshot.build import _displaced_sql
from scheduler.snapshot.queue import _heads_sql
from tests.factories import JobEventFactory, JobFactory, row_columns

pytestmark = [pytest.mark.django_db, pytest.mark.postgresql("prepared statements and plans")]


def _generic_plan(sql: str, args: Sequence[str]) -> str:
    """The plan PostgreSQL makes of `sql` for any values (a generic plan), executed with the
    SQL literals `args`; sequential scans priced out, as tests/plans.py does."""
    text = sql
    for n in range(1, len(args) + 1):
        text = text.replace("%s", f"${n}", 1)
    with connection.cursor() as cursor:
        cursor.execute("SET LOCAL enable_seqscan = off")
        cursor.execute("SET LOCAL plan_cache_mode = force_generic_plan")
        cursor.execute(f"PREPARE gantry_generic AS {text}")
        try:
            cursor.execute(f"EXPLAIN EXECUTE gantry_generic({', '.join(args)})")
            return "\n".join(row[0] for row in cursor.fetchall())
        finally:
            cursor.execute("DEALLOCATE gantry_generic")


@pytest.fixture
def history() -> None:
    """Two thousand jobs run and their events, a few queued jobs and preemptions, ANALYZEd."""
    columns = row_columns(JobFactory(state=JobState.SUCCEEDED))
    finals = sorted(FINAL_STATES)
    rows = [
        Job(**(columns | {"name": f"done-{n}", "state": finals[n % len(finals)]}))
        for n in range(2000)
    ]
    rows += [Job(**(columns | {"name": f"queued-{n}", "state": JobState.QUEUED})) for n in range(5)]
    jobs = Job.objects.bulk_create(rows)
    event = row_columns(JobEventFactory(job=jobs[0]))
    JobEvent.objects.bulk_create(
        [JobEvent(**(event | {"job_id": j.id, "kind": "state"})) for j in jobs]
        + [JobEvent(**(event | {"job_id": j.id, "kind": "preempted"})) for j in jobs[:5]]
    )
    with connection.cursor() as cursor:
        cursor.execute(f"ANALYZE {Job._meta.db_table}")
        cursor.execute(f"ANALYZE {JobEvent._meta.db_table}")


@pytest.mark.usefixtures("history")
def test_the_queue_heads_read_by_the_partial_index_under_a_generic_plan() -> None:
    plan = _generic_plan(_heads_sql(), ["50", "500"])
    assert "job_queue_heads" in plan, plan
    assert "Seq Scan on scheduler_job" not in plan, plan


@pytest.mark.usefixtures("history")
def test_the_preemptions_read_by_the_partial_index_under_a_generic_plan() -> None:
    since = timezone.now() - timedelta(hours=6)
    plan = _generic_plan(_displaced_sql(), [f"'{since.isoformat()}'::timestamptz", "0"])
    assert "jobevent_failures_at" in plan, plan


def _prepared(fragment: str) -> list[tuple[Any, ...]]:
    """(generic plans, custom plans) of this session's prepared statements containing
    `fragment`."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT generic_plans, custom_plans FROM pg_prepared_statements"
            " WHERE statement LIKE %s",
            [f"%{fragment}%"],
        )
        return cursor.fetchall()


@pytest.mark.usefixtures("history")
def test_the_daemons_sessions_keep_generic_plans_where_they_cost_no_more() -> None:
    since = timezone.now() - timedelta(hours=6)
    with daemon_sessions():
        for _ in range(20):
            with connection.cursor() as cursor:
                cursor.execute(_displaced_sql(), [since, 0])
                cursor.fetchall()
            # A state as a value: a generic plan could not use the partial index by state
            list(Job.objects.filter(state=JobState.PREEMPTED).values_list("id", flat=True))
        displaced = _prepared("jobevent_failures_at") or _prepared("FROM scheduler_jobevent")
        by_state = _prepared('WHERE "scheduler_job"."state" = $1')
    assert displaced and displaced[0][0] > 0, displaced  # generic plans kept
    assert by_state and by_state[0] == (0, by_state[0][1]) and by_state[0][1] >= 10, by_state


def test_the_web_sessions_plan_every_execution_for_its_values() -> None:
    since = timezone.now() - timedelta(hours=6)
    for _ in range(20):
        with connection.cursor() as cursor:
            cursor.execute(_displaced_sql(), [since, 0])
            cursor.fetchall()
    displaced = _prepared("FROM scheduler_jobevent")
    assert displaced and displaced[0][0] == 0 and displaced[0][1] >= 10, displaced
