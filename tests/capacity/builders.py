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
    job = f.JobFactory(
        project=project, replicas=gpus, gpu_milli_per_replica=1000, flavors=flavors or []
    )
    Job.objects.filter(pk=job.pk).update(created_at=created, finished_at=finished)
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


def stored_run(org: Any, *, days: int = 28, horizon: int = 120) -> Any:
    """A finished forecast run as the refresh would leave it (no fit: fast), on H100-80GB:
    the pool of 8 GPUs and each subtree, teams growing at different paces (team-alpha
    fastest), and the pool's p50 passing 8 x 24 x 0.8 = 153.6 GPU-hours a day on day 41."""
    from capacity.models import ForecastRun, ForecastRunState, PoolForecast

    run = ForecastRun.objects.create(
        started_at=TODAY,
        finished_at=TODAY,
        state=ForecastRunState.DONE,
        last_day=(TODAY - timedelta(days=1)).date(),
        history_days=days,
        horizon_days=horizon,
        method="test",
        baseline="test",
    )
    slopes = {org.alpha: 1.0, org.bravo: 0.5, org.charlie: 0.25}

    def team(slope: float, offset: int) -> tuple[list[float], list[float]]:
        return (
            [20 + slope * d for d in range(days)],
            [20 + slope * (days + d) for d in range(horizon)],
        )

    series = {t: team(s, 0) for t, s in slopes.items()}

    def add(*teams: Any) -> tuple[list[float], list[float]]:
        return (
            [sum(series[t][0][d] for t in teams) for d in range(days)],
            [sum(series[t][1][d] for t in teams) for d in range(horizon)],
        )

    rows = {
        None: add(org.alpha, org.bravo, org.charlie),
        org.acme: add(org.alpha, org.bravo, org.charlie),
        org.research: add(org.alpha, org.bravo),
        org.product: add(org.charlie),
        **series,
    }
    for tenant, (history, p50) in rows.items():
        PoolForecast.objects.create(
            run=run,
            flavor="H100-80GB",
            tenant=tenant,
            requested=history,
            allocated=[v * 0.9 for v in history],
            used=[v * 0.6 for v in history],
            p10=[v * 0.9 for v in p50],
            p50=p50,
            p90=[v * 1.1 for v in p50],
            baseline=[history[-7 + d % 7] for d in range(horizon)],
            method="test",
            capacity_gpus=8 if tenant is None else 0,
        )
    return run
