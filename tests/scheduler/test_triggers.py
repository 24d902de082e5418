"""The device-share triggers keep `GpuDevice.allocated_milli` equal to the live shares, on
both databases, whatever migration rebuilt the table (issue 17, point 1: on SQLite migration
0008 rebuilt `scheduler_allocationdevice`, its triggers went with it, every device read 0 milli
and the over-allocation CHECK never fired)."""

from __future__ import annotations

from typing import Any

import pytest
from django.core.management import call_command
from django.db import IntegrityError, connection, transaction

from scheduler.models import AllocationDevice, GpuDevice
from scheduler.nodes.triggers import TRIGGERS, ensure_sqlite_triggers
from tests import factories as f

NAMES = sorted(TRIGGERS)


def installed() -> list[str]:
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            table = "'scheduler_allocationdevice'::regclass"
            cursor.execute(f"SELECT tgname FROM pg_trigger WHERE tgrelid = {table}")
        else:
            cursor.execute("SELECT name FROM sqlite_master WHERE type = 'trigger'")
        return sorted(name for (name,) in cursor.fetchall() if name in TRIGGERS)


def share(device: GpuDevice, milli: int) -> AllocationDevice:
    allocation = f.AllocationFactory(node=device.node)
    return AllocationDevice.objects.create(allocation=allocation, device=device, milli=milli)


def test_the_device_share_triggers_survive_every_migration(db: Any) -> None:
    assert installed() == NAMES


def test_devices_count_their_shares_and_refuse_a_second_whole_gpu(db: Any) -> None:
    device = GpuDevice.objects.create(node=f.NodeFactory(), index=0, memory_mib=81920)
    first = share(device, 600)
    device.refresh_from_db()
    assert device.allocated_milli == 600
    with pytest.raises(IntegrityError), transaction.atomic():
        share(device, 500)  # 1100 of 1000
    AllocationDevice.objects.filter(pk=first.pk).update(released=True)
    device.refresh_from_db()
    assert device.allocated_milli == 0


@pytest.mark.django_db(transaction=True)
def test_a_lost_trigger_is_put_back_by_migrate_and_the_devices_recounted() -> None:
    if connection.vendor != "sqlite":
        pytest.skip("SQLite: its table rebuilds drop triggers; PostgreSQL keeps them")
    device = GpuDevice.objects.create(node=f.NodeFactory(), index=0, memory_mib=81920)
    with connection.cursor() as cursor:  # what a table rebuild does
        for name in NAMES:
            cursor.execute(f"DROP TRIGGER {name}")
    share(device, 750)
    device.refresh_from_db()
    assert device.allocated_milli == 0  # the defect: the share is not counted
    call_command("migrate", verbosity=0)  # post_migrate puts them back
    assert installed() == NAMES
    device.refresh_from_db()
    assert device.allocated_milli == 750
    assert ensure_sqlite_triggers(connection) == []  # nothing missing any more
