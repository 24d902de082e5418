"""Rows for capacity's tests: jobs, allocations and roll-ups at given times."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from scheduler.models import Allocation, Job, UtilizationRollup
from scheduler.models.utilization import RollupPeriod, RollupScope
from tests import factories as f

# "Today" of these tests: the history ends the day before (the last whole day).
TODAY = datetime(2026, 11, 20, tzinfo=UTC)


def day(n: int, hour: float = 0) -> datetime:
    """Midnight of TODAY + n days, plus `hour` hours."""
    return TODAY + timedelta(days=n, hours=hour)


def job_at(
    project: Any,
    *,
    created: datetime,
    finished: datetime | None = None,
    gpus: int = 1,
    flavors: list[str] | None = None,
) -> Job:
    job = f.JobFactory(project=project, replicas=gpus, gpu_milli_per_replica=1000)
    spec = {**job.spec, "flavors": flavors} if flavors else job.spec
    Job.objects.filter(pk=job.pk).update(created_at=created, finished_at=finished, spec=spec)
    job.refresh_from_db()
    return job


def ran(job: Job, *, started: datetime, ended: datetime | None, flavor: str) -> list[Allocation]:
    node = f.NodeFactory(flavor=flavor)
    return [
        f.AllocationFactory(job=job, node=node, replica=r, started_at=started, ended_at=ended)
        for r in range(job.replicas)
    ]


def rollup(tenant: Any, *, at: datetime, flavor: str, gpu_seconds: float, mean: float) -> None:
    UtilizationRollup.objects.create(
        period=RollupPeriod.HOUR,
        scope=RollupScope.TENANT,
        key_id=tenant.pk,
        flavor=flavor,
        start=at,
        tenant=tenant,
        samples=12,
        utilization_mean=mean,
        utilization_max=mean,
        utilization_p95=mean,
        gpu_seconds=gpu_seconds,
    )
