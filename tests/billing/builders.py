"""Small builders for billing tests: a node with devices, an allocation holding shares."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from scheduler.models import Allocation, AllocationDevice, GpuDevice, Job, Node
from tests import factories as f

T0 = datetime(2031, 1, 31, 20, 0, tzinfo=UTC)


def at(hours: float) -> datetime:
    return T0 + timedelta(hours=hours)


def make_node(name: str = "n1", gpus: int = 8, flavor: str = "H100-80GB") -> Node:
    node = f.NodeFactory(name=name, flavor=flavor)
    for index in range(gpus):
        GpuDevice.objects.create(node=node, index=index, model=flavor, memory_mib=81920)
    return node


def hold(
    job: Job,
    node: Node,
    start: float,
    end: float | None,
    shares: list[int],
    *,
    first_device: int = 0,
    replica: int = 0,
    attempt: int | None = None,
) -> Allocation:
    """An allocation of `job` on `node` from at(start) to at(end) (None: still held) with a
    share of `shares[i]` milli of device first_device + i."""
    allocation = f.AllocationFactory(
        job=job,
        node=node,
        replica=replica,
        attempt=job.attempt if attempt is None else attempt,
        flavor=node.flavor,
        gpu_milli=sum(shares),
        started_at=at(start),
        ended_at=at(end) if end is not None else None,
        pod_name=f"gantry-{job.pk}-a{job.attempt if attempt is None else attempt}-r{replica}",
    )
    devices = GpuDevice.objects.filter(node=node).order_by("index")
    for offset, milli in enumerate(shares):
        AllocationDevice.objects.create(
            allocation=allocation,
            device=devices[first_device + offset],
            milli=milli,
            released=end is not None,
        )
    return allocation


def job_for(org: Any, username: str = "alice", **kw: Any) -> Job:
    project = kw.pop("project", org.proj_alpha)
    return f.JobFactory(project=project, submitted_by=org.users[username], **kw)
