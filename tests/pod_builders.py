"""A job with pods across a preemption and requeue, with fractional GPU shares: for the
pods and logs tests of the API, the portal and the CLI."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from scheduler.models import Allocation, AllocationDevice, GpuDevice, Job, JobState
from tests import factories as f
from tests.conftest import Org


@dataclass
class Requeued:
    """A 2-replica job of half GPUs: attempt 0 ran on node-a and was preempted, attempt 1
    runs on node-b."""

    job: Job
    first: list[Allocation]
    second: list[Allocation]


def requeued_job(org: Org, now: datetime) -> Requeued:
    job = f.JobFactory(
        project=org.proj_alpha,
        submitted_by=org.users["alice"],
        replicas=2,
        gpus_per_replica=0,
        gpu_milli_per_replica=500,
        attempt=1,
        state=JobState.RUNNING,
    )
    node_a, node_b = f.NodeFactory(name="node-a"), f.NodeFactory(name="node-b")
    devices = {
        (node, i): GpuDevice.objects.create(node=node, index=i, model="H100-80GB", memory_mib=81920)
        for node in (node_a, node_b)
        for i in (0, 1)
    }
    placed, preempted = now - timedelta(hours=2), now - timedelta(hours=1)
    first = [
        f.AllocationFactory(
            job=job,
            node=node_a,
            attempt=0,
            replica=r,
            started_at=placed,
            bound_at=placed + timedelta(seconds=3),
            ended_at=preempted,
            end_reason="attempt ended",
        )
        for r in (0, 1)
    ]
    second = [
        f.AllocationFactory(
            job=job, node=node_b, attempt=1, replica=r, started_at=preempted, bound_at=preempted
        )
        for r in (0, 1)
    ]
    for allocation in first:  # both halves on node-a's GPU 0
        AllocationDevice.objects.create(
            allocation=allocation, device=devices[node_a, 0], milli=500, memory_mib=40960,
            released=True,
        )  # fmt: skip
    for r, allocation in enumerate(second):  # one half on each of node-b's GPUs
        AllocationDevice.objects.create(
            allocation=allocation, device=devices[node_b, r], milli=500, memory_mib=40960
        )
    return Requeued(job, first, second)
