"""Utilization samples in: attributed to the job holding each device when they are written.

`samples_ingest` is the one ingest path, for the node agent's reports (scheduler/nodes/services.py)
and the daemon's simulated readings (scheduler/daemon/samples.py): one read of the live
device shares and one insert per call (COPY on PostgreSQL), whatever the number of devices.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.db import connection, transaction

from common.db.bulk import copy_rows
from scheduler.models import AllocationDevice, GpuDevice, UtilizationSample

BATCH = 2000  # rows per INSERT where there is no COPY: one statement per node group's report
# The columns written, in the order of `samples_ingest`'s rows.
COLUMNS = (
    "at",
    "device_id",
    "flavor",
    "utilization_pct",
    "memory_used_mib",
    "power_w",
    "temperature_c",
    "sm_active_pct",
    "job_id",
    "tenant_id",
    "project_id",
    "share_milli",
)
NO_HOLDER = (None, None, None)
# Devices asked about beyond which `holders_of` reads every live share rather than send the
# ids: there are no more live shares than devices in use, and an array of tens of thousands
# of ids costs more to send than the shares to read.
BY_ID_MAX = 1000


@dataclass(frozen=True)
class DeviceReading:
    """A device's reading; None where the GPU or the driver does not offer the field."""

    device_id: int
    utilization_pct: float
    memory_used_mib: int | None = None
    power_w: float | None = None
    temperature_c: float | None = None
    sm_active_pct: float | None = None


@dataclass(frozen=True)
class Holder:
    job_id: int
    tenant_id: int
    project_id: int
    share_milli: int


def holders_of(device_ids: Sequence[int]) -> dict[int, Holder]:
    """Who holds each device now, from the live shares: on a shared device, the largest
    share (the oldest allocation among equals), since a device's utilization cannot be
    split between the processes sharing it."""
    best: dict[int, tuple[tuple[int, int], Holder]] = {}
    live = AllocationDevice.objects.filter(released=False, allocation__ended_at__isnull=True)
    wanted = None
    if len(device_ids) > BY_ID_MAX:  # a whole cluster's round: every live share, filtered here
        wanted = set(device_ids)
    else:
        live = live.filter(device_id__any=list(device_ids))
    rows = live.values_list(
        "device_id",
        "milli",
        "allocation_id",
        "allocation__job_id",
        "allocation__job__tenant_id",
        "allocation__job__project_id",
    )
    for device_id, milli, allocation_id, job_id, tenant_id, project_id in rows:
        if wanted is not None and device_id not in wanted:
            continue
        rank = (milli, -allocation_id)
        if device_id not in best or rank > best[device_id][0]:
            best[device_id] = (rank, Holder(job_id, tenant_id, project_id, milli))
    return {device_id: holder for device_id, (_, holder) in best.items()}


def samples_ingest(
    readings: Sequence[DeviceReading],
    *,
    at: datetime,
    flavors: dict[int, str] | None = None,
    fence: Callable[[], None] | None = None,
) -> int:
    """Store `readings` as samples taken `at`, each attributed to the job, tenant and project
    holding its device at this moment (none for a free device). `flavors` (device id ->
    model) saves a read when the caller has the devices at hand. `fence` runs last inside
    the insert's transaction, before its commit, and raises to refuse it (the daemon's
    lease: a stale leader's round must not land beside the new leader's; last, so that the
    lease is not held while the rows are copied, `Lease.writing`). Returns the rows
    written."""
    if not readings:
        return 0
    outer = connection.in_atomic_block
    ids = [r.device_id for r in readings]
    if flavors is None:
        flavors = dict(GpuDevice.objects.filter(id__any=ids).values_list("id", "model"))
    holders = holders_of(ids)
    rows = []
    for r in readings:
        holder = holders.get(r.device_id)
        rows.append(
            (
                at,
                r.device_id,
                flavors.get(r.device_id, ""),
                r.utilization_pct,
                r.memory_used_mib,
                r.power_w,
                r.temperature_c,
                r.sm_active_pct,
                *((holder.job_id, holder.tenant_id, holder.project_id) if holder else NO_HOLDER),
                holder.share_milli if holder else 0,
            )
        )
    with transaction.atomic():
        if connection.vendor == "postgresql" and not outer:
            # Telemetry: a crash of the server may lose the last instant's samples, which the
            # next ones replace, so the insert does not wait for its WAL to reach the disk.
            # Inside a caller's transaction (the agent's report) its own rules hold.
            with connection.cursor() as cursor:
                cursor.execute("SET LOCAL synchronous_commit TO OFF")
        _insert(rows)
        if fence is not None:
            fence()
    return len(rows)


def _insert(rows: list[tuple[Any, ...]]) -> None:
    """The rows (COLUMNS) in one COPY on PostgreSQL, elsewhere bulk_create. A round of the
    simulated cluster's 5,000 nodes is 40,000 rows, which the ORM's insert builds and
    quotes field by field in Python."""
    if connection.vendor != "postgresql":
        UtilizationSample.objects.bulk_create(
            [UtilizationSample(**dict(zip(COLUMNS, row, strict=True))) for row in rows],
            batch_size=BATCH,
        )
        return
    copy_rows(UtilizationSample._meta.db_table, COLUMNS, rows)
