"""Utilization samples in: attributed to the job holding each device when they are written.

`samples_ingest` is the one ingest path, for the node agent's reports (scheduler/nodes.py)
and the daemon's simulated readings (scheduler/daemon/samples.py): one read of the live
device shares and one multi-row insert per call, whatever the number of devices.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime

from django.db import connection, transaction

from scheduler.models import AllocationDevice, GpuDevice, UtilizationSample

BATCH = 2000  # rows per INSERT: one statement per report of even a large node group


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
    rows = AllocationDevice.objects.filter(
        released=False, device_id__any=list(device_ids), allocation__ended_at__isnull=True
    ).values_list(
        "device_id",
        "milli",
        "allocation_id",
        "allocation__job_id",
        "allocation__job__tenant_id",
        "allocation__job__project_id",
    )
    for device_id, milli, allocation_id, job_id, tenant_id, project_id in rows:
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
    model) saves a read when the caller has the devices at hand. `fence` runs first inside
    the insert's transaction and raises to refuse it (the daemon's lease: a stale leader's
    round must not land beside the new leader's). Returns the rows written."""
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
            UtilizationSample(
                at=at,
                device_id=r.device_id,
                flavor=flavors.get(r.device_id, ""),
                utilization_pct=r.utilization_pct,
                memory_used_mib=r.memory_used_mib,
                power_w=r.power_w,
                temperature_c=r.temperature_c,
                sm_active_pct=r.sm_active_pct,
                job_id=holder.job_id if holder else None,
                tenant_id=holder.tenant_id if holder else None,
                project_id=holder.project_id if holder else None,
                share_milli=holder.share_milli if holder else 0,
            )
        )
    with transaction.atomic():
        if connection.vendor == "postgresql" and not outer:
            # Telemetry: a crash of the server may lose the last instant's samples, which the
            # next ones replace, so the insert does not wait for its WAL to reach the disk.
            # Inside a caller's transaction (the agent's report) its own rules hold.
            with connection.cursor() as cursor:
                cursor.execute("SET LOCAL synchronous_commit TO OFF")
        if fence is not None:
            fence()
        UtilizationSample.objects.bulk_create(rows, batch_size=BATCH)
    return len(rows)
