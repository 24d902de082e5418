"""Metering: allocations -> usage records per closed hour, once, whatever happens to the run."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.core.management import call_command
from django.db import IntegrityError, transaction

from billing.metering.attempts import attempt_kinds
from billing.metering.hourly import hours_due, meter_hour, meter_usage
from billing.models import MeteringPeriod, UsageRecord
from scheduler.models import JobEvent, JobState
from tests.billing.builders import T0, at, hold, job_for, make_node
from tests.concurrency import rendezvous, run_in_threads
from tests.conftest import Org


def records() -> list[tuple[Any, ...]]:
    return sorted(UsageRecord.objects.values_list("allocation_id", "start", "end", "gpu_milli"))


def test_a_device_is_held_from_started_at_to_ended_at_split_at_hours(org: Org) -> None:
    node = make_node()
    job = job_for(org, cpu_milli=8000, memory_mib=32768)
    # 10:20 to 12:40 (T0 + 0h20 .. 2h40), half of device 0 and a quarter of device 1.
    allocation = hold(job, node, 1 / 3, 8 / 3, [500, 250])
    assert meter_usage(now=at(4)) == 3  # hours 20:00, 21:00, 22:00 (23:00 not closed + delay)
    assert records() == [
        (allocation.pk, at(1 / 3), at(1), 750),
        (allocation.pk, at(1), at(2), 750),
        (allocation.pk, at(2), at(8 / 3), 750),
    ]
    record = UsageRecord.objects.first()
    assert record is not None
    assert (record.cpu_milli, record.memory_mib, record.tenant_id, record.user_id) == (
        8000,
        32768,
        org.alpha.pk,
        org.users["alice"].pk,
    )
    assert (record.project_id, record.priority_class, record.borrowed) == (
        org.proj_alpha.pk,
        "normal",
        False,
    )


def test_an_allocation_still_held_is_metered_to_the_end_of_each_closed_hour(org: Org) -> None:
    allocation = hold(job_for(org), make_node(), 0.5, None, [1000])
    meter_usage(now=at(2) + timedelta(minutes=10))
    assert records() == [(allocation.pk, at(0.5), at(1), 1000), (allocation.pk, at(1), at(2), 1000)]


def test_an_hour_is_metered_only_after_the_metering_delay(org: Org, settings: Any) -> None:
    settings.GANTRY_METERING_DELAY_S = 300
    hold(job_for(org), make_node(), 0, 0.5, [1000])
    assert hours_due(at(1) + timedelta(seconds=299)) == []
    assert hours_due(at(1) + timedelta(seconds=300)) == [T0]


def test_metering_twice_meters_nothing_twice(org: Org) -> None:
    hold(job_for(org), make_node(), 0, 3, [1000])
    assert meter_usage(now=at(5)) == 4
    first = records()
    assert meter_usage(now=at(5)) == 0
    assert meter_hour(T0, now=at(5)) is False
    assert records() == first
    assert MeteringPeriod.objects.count() == 4


def test_the_database_refuses_a_second_record_of_an_allocation_in_an_hour(org: Org) -> None:
    hold(job_for(org), make_node(), 0, 1, [1000])
    meter_usage(now=at(2))
    record = UsageRecord.objects.get()
    record.pk = None
    with pytest.raises(IntegrityError), transaction.atomic():
        record.save()


class Killed(Exception):
    pass


@pytest.mark.parametrize("step", ["claimed", "read", "written", "finished"])
def test_a_run_killed_between_its_steps_leaves_no_partial_hour(org: Org, step: str) -> None:
    node = make_node()
    a = hold(job_for(org), node, 0, 2.5, [1000])
    b = hold(job_for(org, "tina"), node, 0.5, 1.5, [250], first_device=1)

    seen: list[str] = []

    def kill_in_second_hour(name: str) -> None:
        seen.append(name)
        if name == step and seen.count(step) == 2:
            raise Killed(name)

    with pytest.raises(Killed):
        meter_usage(now=at(3), fault=kill_in_second_hour)
    # The first hour is complete; the second left nothing behind.
    assert list(MeteringPeriod.objects.values_list("start", "records")) == [(T0, 2)]
    assert records() == [(a.pk, at(0), at(1), 1000), (b.pk, at(0.5), at(1), 250)]
    # The next run completes the second hour, and the third.
    assert meter_usage(now=at(3) + timedelta(minutes=5)) == 2
    assert records() == [
        (a.pk, at(0), at(1), 1000),
        (a.pk, at(1), at(2), 1000),
        (a.pk, at(2), at(2.5), 1000),
        (b.pk, at(0.5), at(1), 250),
        (b.pk, at(1), at(1.5), 250),
    ]


def test_concurrent_runs_meter_each_hour_once(
    transactional_db: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from billing.metering import hourly as metering
    from tests.conftest import build_org

    org = build_org()
    node = make_node()
    for replica in range(4):
        hold(job_for(org), node, 0.25 * replica, 6, [1000], first_device=replica)
    # Force the bad interleaving: every run has found the same hours due before any claims one.
    meet = rendezvous(3)
    original = metering.hours_due

    def due_then_wait(now: Any, limit: int = metering.MAX_HOURS_PER_RUN) -> list[Any]:
        hours = original(now, limit)
        meet()
        return hours

    monkeypatch.setattr(metering, "hours_due", due_then_wait)
    results = run_in_threads(*[lambda: meter_usage(now=at(7))] * 3)
    assert all(kind == "ok" for kind, _ in results), results
    # Hours 0..5 are closed (at(7) less the delay), each metered by exactly one run.
    assert sum(value for _, value in results) == 6
    assert UsageRecord.objects.count() == 4 * 6
    assert list(MeteringPeriod.objects.values_list("records", flat=True)) == [4] * 6


def test_the_management_command_meters_on_demand(org: Org) -> None:
    hold(job_for(org), make_node(), 0, 1, [1000])
    call_command("meter_usage", "--now", at(2).isoformat())
    assert MeteringPeriod.objects.filter(start=T0).exists()
    assert len(records()) == 1


def test_the_hourly_task_is_scheduled(settings: Any) -> None:
    from billing.tasks import meter_closed_hours

    # Hourly, at the minute each hour becomes due (billing/metering/schedule.py).
    entry = settings.CELERY_BEAT_SCHEDULE["billing-meter"]
    assert entry["task"] == meter_closed_hours.name
    assert entry["schedule"].minute == {5} and len(entry["schedule"].hour) == 24


def event(job: Any, hours: float, from_state: str, to_state: str) -> None:
    row = JobEvent.objects.create(job=job, kind="state", from_state=from_state, to_state=to_state)
    JobEvent.objects.filter(pk=row.pk).update(at=at(hours))


def test_attempts_are_classified_by_how_they_ended(org: Org) -> None:
    node = make_node()
    job = job_for(org, state=JobState.FAILED, attempt=2)
    preempted = hold(job, node, 0, 1, [1000], attempt=0)
    event(job, 1, JobState.RUNNING, JobState.PREEMPTED)
    retried = hold(job, node, 1.5, 2, [1000], attempt=1, first_device=1)
    event(job, 2, JobState.RUNNING, JobState.QUEUED)
    failed = hold(job, node, 2.5, 3, [1000], attempt=2, first_device=2)
    event(job, 3, JobState.RUNNING, JobState.FAILED)
    running = hold(job_for(org), node, 0, None, [1000], first_device=3)
    done_job = job_for(org, state=JobState.SUCCEEDED)
    done = hold(done_job, node, 0, 1, [1000], first_device=4)
    event(done_job, 1, JobState.RUNNING, JobState.SUCCEEDED)
    allocations = [preempted, retried, failed, running, done]
    kinds = attempt_kinds((a.pk, a.job_id, a.started_at) for a in allocations)
    assert [kinds[a.pk] for a in allocations] == ["preempted", "failed", "failed", "used", "used"]


def test_who_a_usage_record_charges_cannot_be_deleted_through_the_orm(org: Org) -> None:
    # The tenant, project and user columns carry no database constraint (checking them at
    # each hour's commit is a large part of metering's work in PostgreSQL); PROTECT holds.
    from django.db.models import ProtectedError

    hold(job_for(org), make_node(), 0, 1, [1000])
    meter_usage(now=at(2))
    record = UsageRecord.objects.get()
    for owner in (record.tenant, record.project, record.user):
        with pytest.raises(ProtectedError) as refused:
            owner.delete()
        assert record in refused.value.protected_objects
    assert UsageRecord.objects.count() == 1


@pytest.mark.postgresql("the indexes, foreign keys and query plans are PostgreSQL's")
def test_usage_records_carry_only_the_indexes_and_keys_their_readers_need(org: Org) -> None:
    # Each index is a write per record and each foreign key a check per record at the hour's
    # commit. Kept: the primary key, usage_once (the backstop of "metered once", and how a
    # job's records are found: by its allocations), the period's index (statements, the hour
    # splits and the forecast read records by period); the allocation's key (another
    # transaction's row). Nothing reads records by tenant, project or user alone.
    from django.db import connection

    table = UsageRecord._meta.db_table
    with connection.cursor() as cursor:
        found = connection.introspection.get_constraints(cursor, table)
    indexes = sorted(
        tuple(c["columns"]) for c in found.values() if c["index"] or c["unique"] or c["primary_key"]
    )
    keys = sorted(c["foreign_key"] for c in found.values() if c["foreign_key"])
    assert indexes == [("allocation_id", "period_id"), ("id",), ("period_id",)]
    assert keys == [("scheduler_allocation", "id")]

    allocation = hold(job_for(org), make_node(), 0, 2, [1000])
    meter_usage(now=at(3))
    periods = list(MeteringPeriod.objects.values_list("id", flat=True))
    records = UsageRecord.objects.order_by()
    with transaction.atomic(), connection.cursor() as cursor:
        # The tables are tiny: ask which index would serve each reader.
        cursor.execute("SET LOCAL enable_seqscan = off")
        by_period = records.filter(period_id__in=periods).explain()
        by_allocation = records.filter(allocation_id=allocation.pk).explain()
    assert "billing_usagerecord_period_id" in by_period, by_period
    assert "usage_once" in by_allocation, by_allocation
