"""The daemon's rows (a job's events, allocations and device shares) keep their references
without database-checked foreign keys: the ORM cascades and protects, and only the daemon
writes them, in the transaction that holds the job's row."""

from __future__ import annotations

import pytest
from django.db import connection
from django.db.models import ProtectedError

from scheduler.models import Allocation, AllocationDevice, GpuDevice, Job, JobEvent
from tests import factories as f

pytestmark = pytest.mark.django_db


def _shared(allocation: Allocation) -> AllocationDevice:
    device = GpuDevice.objects.create(node=allocation.node, index=0)
    return AllocationDevice.objects.create(allocation=allocation, device=device, milli=1000)


@pytest.mark.postgresql("constraint catalogue")
def test_the_daemons_rows_have_no_checked_keys_to_jobs_nodes_and_devices() -> None:
    """A checked key is a row lock and a write on the job, node or device for every event,
    allocation and share written: none of the four tables refers to them in the catalogue.
    The job's own references (project, team, user, class) stay checked."""
    tables = [m._meta.db_table for m in (JobEvent, Allocation, AllocationDevice)]
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT conrelid::regclass::text, confrelid::regclass::text FROM pg_constraint"
            " WHERE contype = 'f' AND conrelid::regclass::text = ANY(%s)",
            [tables],
        )
        checked = set(cursor.fetchall())
        cursor.execute(
            "SELECT count(*) FROM pg_constraint WHERE contype = 'f' AND conrelid = %s::regclass",
            [Job._meta.db_table],
        )
        job_keys = cursor.fetchone()[0]
    assert checked == {(JobEvent._meta.db_table, "auth_user")}
    assert job_keys == 4


def test_deleting_a_job_deletes_its_events_allocations_and_shares() -> None:
    job = f.JobFactory()
    f.JobEventFactory(job=job)
    (allocation,) = f.place(job)
    share = _shared(allocation)
    other = f.JobFactory()
    f.JobEventFactory(job=other)
    job.delete()
    assert not JobEvent.objects.filter(job_id=job.pk).exists()
    assert not Allocation.objects.filter(pk=allocation.pk).exists()
    assert not AllocationDevice.objects.filter(pk=share.pk).exists()
    assert JobEvent.objects.filter(job=other).count() == 1


def test_a_node_or_device_in_use_is_not_deleted() -> None:
    (allocation,) = f.place(f.JobFactory())
    share = _shared(allocation)
    with pytest.raises(ProtectedError):
        allocation.node.delete()
    with pytest.raises(ProtectedError):
        share.device.delete()
    assert GpuDevice.objects.filter(pk=share.device_id).exists()


def test_deleting_a_user_keeps_their_events_without_an_actor() -> None:
    user = f.UserFactory()
    job = f.JobFactory()
    event = f.JobEventFactory(job=job, actor=user)
    user.delete()
    event.refresh_from_db()
    assert event.actor_id is None
