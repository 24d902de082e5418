"""A small past for what-if tests: one 8-GPU H100 node and jobs of the last hours."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from scheduler.models import GpuDevice, Job, JobState, Node
from tests import factories as f
from tests.conftest import Org


def eight_gpu_node(name: str = "h100-a") -> Node:
    node = f.NodeFactory(name=name)
    for index in range(8):
        GpuDevice.objects.create(node=node, index=index, memory_mib=81920, model="H100")
    return node


def ran(org: Org, project: Any, *, at: datetime, hours: float, gpus: int, node: Node) -> Job:
    """A job queued at `at` that ran `hours` on `node` at once, and succeeded."""
    job = f.JobFactory(
        project=project,
        submitted_by=org.users["alice"],
        state=JobState.SUCCEEDED,
        gpus_per_replica=gpus,
        gpu_milli_per_replica=gpus * 1000,
        flavors=["H100-80GB"],
        queued_at=at,
        started_at=at,
        finished_at=at + timedelta(hours=hours),
        max_runtime_s=int(hours * 3600 * 2),
    )
    f.AllocationFactory(job=job, node=node, started_at=at, ended_at=at + timedelta(hours=hours))
    return job


def a_busy_past(org: Org, now: datetime) -> None:
    """Within the last day, on 8 GPUs: two 8-GPU hour-long jobs of team-alpha, one of
    team-bravo and one 4-GPU job of team-charlie, all queued two minutes apart."""
    node = eight_gpu_node()
    start = now - timedelta(hours=10)
    projects = [org.proj_alpha, org.proj_alpha, org.proj_bravo, org.proj_charlie]
    for k, (project, gpus) in enumerate(zip(projects, [8, 8, 8, 4], strict=True)):
        ran(org, project, at=start + timedelta(minutes=2 * k), hours=1, gpus=gpus, node=node)


def kept_run(user: Any, scope: Any, tenant_slugs: list[str]) -> Any:
    """A finished what-if scoped to `scope`, its results naming `tenant_slugs`."""
    from django.utils import timezone

    from whatif.models import WhatIf, WhatIfState

    row = {
        "jobs": 1,
        "waits": [60.0],
        "never_started": 0,
        "preemptions": 0,
        "gpu_hours": 1.0,
        "borrowed_gpu_hours": 0.0,
    }
    side = {
        "utilization": 0.5,
        "fairness": 1.0,
        "preemptions": 0,
        "borrowed_gpu_hours": 0.0,
        "cycles": 1,
        "tenants": {slug: dict(row) for slug in tenant_slugs},
    }
    now = timezone.now()
    return WhatIf.objects.create(
        requested_by=user,
        scope=scope,
        window_days=1,
        changes=[{"kind": "quota", "tenant": scope.slug, "flavor": "H100-80GB", "weight": 2.0}],
        state=WhatIfState.DONE,
        progress=100,
        results={
            "jobs_found": 1,
            "jobs_replayed": 1,
            "capped": False,
            "baseline": side,
            "proposed": side,
        },
        created_at=now,
        finished_at=now,
        expires_at=now + timedelta(days=90),
    )
