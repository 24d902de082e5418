"""A job's events are written four or more times in its life: each index on the table is a
write more. Reads by time use partial indexes of the few kinds they read."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.db import connection
from django.utils import timezone

from scheduler.models import JobEvent
from scheduler.snapshot.build import _displaced_sql
from scheduler.telemetry.dashboards import FAILURE_KINDS
from scheduler.telemetry.queue_history import admission_waits
from tests.factories import JobFactory
from tests.plans import index_plan

pytestmark = [pytest.mark.django_db, pytest.mark.postgresql("index definitions and plans")]


def _indexes() -> dict[str, str]:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT indexname, indexdef FROM pg_indexes WHERE tablename = %s",
            [JobEvent._meta.db_table],
        )
        return dict(cursor.fetchall())


def test_an_ordinary_event_enters_only_the_key_and_the_job_indexes() -> None:
    """Every index of the events but the primary key and the job's is partial: a state
    change by the daemon (started, finished...), which has no actor, is written to two."""
    full = [name for name, sql in _indexes().items() if " WHERE " not in sql]
    assert len(full) == 2, full
    assert any(name.endswith("_pkey") for name in full)


def test_a_users_events_are_found_by_the_actor_index() -> None:
    """Deleting a user sets their events' actor to NULL: the events are found by the
    partial index of those that have one, not by a scan of the history."""
    events = JobEvent.objects.filter(actor_id__in=[1, 2]).values("id")
    assert "jobevent_actor" in index_plan(events)


def test_the_reads_by_time_have_an_index() -> None:
    """The failures of a dashboard's window and the admissions of a minute are read by an
    index of their kinds, not by a scan of the whole history."""
    now = timezone.now()
    failures = JobEvent.objects.filter(
        at__gte=now - timedelta(days=30), at__lt=now, kind__in=FAILURE_KINDS
    ).values("kind")
    plan = index_plan(failures)
    assert "jobevent_failures_at" in plan, plan
    admissions = JobEvent.objects.filter(
        at__gte=now - timedelta(minutes=1), at__lt=now, to_state="admitted", from_state="queued"
    ).values("id")
    assert "jobevent_admitted_at" in index_plan(admissions)
    assert admission_waits(now - timedelta(minutes=1), now) == []


def test_the_snapshots_recent_preemptions_have_an_index() -> None:
    """The ping-pong guard's read of recent preemptions, every cycle, uses the failures'
    partial index. The plan is asked of a table with a history, as in production: on a
    near-empty table the planner may as well walk the primary key (`id > 0`), and which it
    picks would depend on what earlier tests left behind."""
    job = JobFactory()
    long_ago = timezone.now() - timedelta(days=3)
    JobEvent.objects.bulk_create(
        JobEvent(job=job, kind="started", to_state="running") for _ in range(5000)
    )
    JobEvent.objects.bulk_create(JobEvent(job=job, kind="preempted") for _ in range(20))
    JobEvent.objects.update(at=long_ago)
    with connection.cursor() as cursor:
        cursor.execute(f"ANALYZE {JobEvent._meta.db_table}")
        cursor.execute(f"EXPLAIN {_displaced_sql()}", [timezone.now() - timedelta(hours=6), 0])
        plan = "\n".join(row[0] for row in cursor.fetchall())
    assert "jobevent_failures_at" in plan, plan
