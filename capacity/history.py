"""Daily demand history per pool (a GPU model: a flavor's name) and tenant subtree, read from
the project's own tables. Called by the refresh (capacity/refresh.py), never at a page view.

Three measures, GPU-hours per day (UTC):
- requested: each job holding GPUs asked for them from its creation to its end (now, while it
  waits or runs): the time it waited in the queue counts, which usage alone hides.
- allocated: each allocation from its start to its end (scheduler's Allocation rows).
- used: the hourly utilization roll-ups per tenant (scheduler/telemetry/rollups.py): the GPU
  time held times the mean utilization (a GPU held at 40% is 0.4 GPU-hours an hour).

A job's pool is its last allocation's flavor, else the first flavor it allows, else ""
(any model: shown as its own line). Each measure is summed per (pool, the job's team) and
then added to every ancestor of the team (a subtree's series holds its teams') and to the
whole pool (key None). Renamed flavors count under their name now (billing's renames).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, date, datetime, time, timedelta

import numpy as np
from django.db.models import Count, Q

from billing.rates.cards import flavor_renames
from capacity.daily import DAY_S, daily_gpu_hours
from scheduler.models import Allocation, GpuDevice, Job, UtilizationRollup
from scheduler.models.utilization import RollupPeriod, RollupScope
from tenants.models import Tenant

MEASURES = ("requested", "allocated", "used")
Key = tuple[str, int | None]  # (pool, subtree's tenant id); None: the whole pool


@dataclass
class Window:
    first_day: date
    days: int
    now: datetime

    @property
    def start(self) -> datetime:
        return datetime.combine(self.first_day, time(), tzinfo=UTC)

    @property
    def end(self) -> datetime:
        return self.start + timedelta(days=self.days)


@dataclass
class _Intervals:
    starts: list[float]
    ends: list[float]
    gpus: list[float]


def _ancestors(paths: dict[int, str], tenant_id: int) -> list[int]:
    return [int(part) for part in paths.get(tenant_id, f"/{tenant_id}/").strip("/").split("/")]


def _requested(window: Window, renames: dict[str, str]) -> dict[Key, _Intervals]:
    jobs = Job.objects.filter(gpu_milli_per_replica__gt=0, created_at__lt=window.end).filter(
        Q(finished_at__isnull=True) | Q(finished_at__gt=window.start)
    )
    # The window's jobs' allocations only; the latest one's flavor wins (ordered last).
    last_flavor = dict(
        Allocation.objects.filter(job__in=jobs.values("id"))
        .order_by("job_id", "started_at")
        .values_list("job_id", "flavor")
    )
    rows = jobs.values_list(
        "id",
        "tenant_id",
        "created_at",
        "finished_at",
        "replicas",
        "gpu_milli_per_replica",
        "flavors",
    )
    groups: dict[Key, _Intervals] = defaultdict(lambda: _Intervals([], [], []))
    for job_id, tenant_id, created, finished, replicas, milli, flavors in rows.iterator(2000):
        allowed = flavors or [""]
        flavor = last_flavor.get(job_id) or allowed[0]
        group = groups[(renames.get(flavor, flavor), tenant_id)]
        group.starts.append(created.timestamp())
        group.ends.append((finished or window.now).timestamp())
        group.gpus.append(replicas * milli / 1000)
    return groups


def _allocated(window: Window, renames: dict[str, str]) -> dict[Key, _Intervals]:
    rows = (
        Allocation.objects.filter(started_at__lt=window.end, gpu_milli__gt=0)
        .filter(Q(ended_at__isnull=True) | Q(ended_at__gt=window.start))
        .values_list("job__tenant_id", "flavor", "started_at", "ended_at", "gpu_milli")
    )
    groups: dict[Key, _Intervals] = defaultdict(lambda: _Intervals([], [], []))
    for tenant_id, flavor, started, ended, milli in rows.iterator(2000):
        group = groups[(renames.get(flavor, flavor), tenant_id)]
        group.starts.append(started.timestamp())
        group.ends.append((ended or window.now).timestamp())
        group.gpus.append(milli / 1000)
    return groups


def _used(window: Window, renames: dict[str, str]) -> dict[Key, np.ndarray]:
    rows = UtilizationRollup.objects.filter(
        period=RollupPeriod.HOUR,
        scope=RollupScope.TENANT,
        start__gte=window.start,
        start__lt=window.end,
    ).values_list("key_id", "flavor", "start", "gpu_seconds", "utilization_mean")
    out: dict[Key, np.ndarray] = defaultdict(lambda: np.zeros(window.days))
    first = window.start.timestamp()
    for tenant_id, flavor, start, gpu_seconds, mean in rows.iterator(2000):
        day = int((start.timestamp() - first) // DAY_S)
        out[(renames.get(flavor, flavor), tenant_id)][day] += gpu_seconds * mean / 100 / 3600
    return out


def _spread(groups: dict[Key, _Intervals], window: Window) -> dict[Key, np.ndarray]:
    first = window.start.timestamp()
    return {
        key: daily_gpu_hours(g.starts, g.ends, g.gpus, first_day=first, days=window.days)
        for key, g in groups.items()
    }


def _roll_up(
    per_team: dict[Key, np.ndarray], paths: dict[int, str], days: int
) -> dict[Key, np.ndarray]:
    out: dict[Key, np.ndarray] = defaultdict(lambda: np.zeros(days))
    for (flavor, tenant_id), series in per_team.items():
        out[(flavor, None)] += series
        if tenant_id is None:
            continue
        for ancestor in _ancestors(paths, tenant_id):
            out[(flavor, ancestor)] += series
    return out


def demand_history(window: Window) -> dict[Key, dict[str, np.ndarray]]:
    """{(pool, tenant id or None): {measure: GPU-hours per day}} over `window`'s days."""
    renames = flavor_renames()
    paths = dict(Tenant.objects.values_list("id", "path"))
    measures = {
        "requested": _roll_up(_spread(_requested(window, renames), window), paths, window.days),
        "allocated": _roll_up(_spread(_allocated(window, renames), window), paths, window.days),
        "used": _roll_up(_used(window, renames), paths, window.days),
    }
    keys: Iterable[Key] = {k for series in measures.values() for k in series}
    zero = np.zeros(window.days)
    return {k: {m: measures[m].get(k, zero) for m in MEASURES} for k in keys}


def pool_capacity_gpus() -> dict[str, float]:
    """Healthy GPUs of present nodes, per pool (the node's flavor)."""
    rows = (
        GpuDevice.objects.filter(node__present=True, healthy=True)
        .values_list("node__flavor")
        .annotate(n=Count("id"))
    )
    return {flavor: float(n) for flavor, n in rows}
