"""What a simulation reports, and the arithmetic behind each figure.

- utilization: allocated GPU-time over capacity x makespan;
- wait: first start minus arrival, p50/p90/p99 per tenant and per priority class;
- JCT: end minus arrival of finished jobs;
- Jain's fairness index over tenants of x_i = (share of GPU-time used) / (share of the
  guarantees), (sum x)^2 / (n sum x^2): 1 when every tenant got its entitlement's share;
- fragmented GPU: time-average of free GPUs while some job waited for fragmentation
  (enough GPUs free in total, not together), as % of capacity;
- preemptions and the GPU-hours they lost (work since start or last checkpoint);
- GPU-hours per tenant, and borrowed GPU-hours: per tenant and flavor, the time integral of
  what its jobs held beyond its own guarantee (best-effort classes, outside quota, borrow
  nothing).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np


@dataclass(frozen=True, slots=True)
class Percentiles:
    count: int
    mean: float
    p50: float
    p90: float
    p99: float

    @classmethod
    def of(cls, values: Sequence[float]) -> Percentiles:
        if not values:
            return cls(0, 0.0, 0.0, 0.0, 0.0)
        data = np.asarray(values, dtype=np.float64)
        p50, p90, p99 = np.percentile(data, [50, 90, 99]).tolist()
        return cls(len(values), float(data.mean()), p50, p90, p99)


@dataclass(frozen=True, slots=True)
class JobOutcome:
    """One job's story. ``state``: succeeded, failed (gave up retrying) or unfinished;
    ``reason``: why it still waited at the end (empty once it ran)."""

    id: str
    tenant: str
    priority_class: str
    arrival_s: float
    first_start_s: float | None
    end_s: float | None
    state: str
    attempts: int
    preemptions: int
    gpu_s: float
    reason: str = ""
    starts_s: tuple[float, ...] = ()  # every start: the first, and each after a requeue

    @property
    def wait_s(self) -> float | None:
        return None if self.first_start_s is None else self.first_start_s - self.arrival_s


@dataclass(frozen=True, slots=True)
class SimReport:
    makespan_s: float
    capacity_gpus: float
    utilization: float
    allocation: tuple[tuple[float, float], ...]  # (time, allocated GPUs) at every change
    wait_by_tenant: Mapping[str, Percentiles]
    wait_by_class: Mapping[str, Percentiles]
    jct: Percentiles
    jain_fairness: float
    fragmented_gpu_pct: float
    preemptions: int
    gpu_hours_lost_to_preemption: float
    gpu_hours_lost_to_failures: float
    cycles: int
    jobs: tuple[JobOutcome, ...]
    gpu_hours_by_tenant: Mapping[str, float] = field(default_factory=dict)
    borrowed_gpu_hours: Mapping[str, float] = field(default_factory=dict)

    def outcome(self, job_id: str) -> JobOutcome:
        return next(j for j in self.jobs if j.id == job_id)


def wait_percentiles(jobs: Sequence[JobOutcome], key: str) -> dict[str, Percentiles]:
    """Wait percentiles grouped by ``key`` ("tenant" or "priority_class")."""
    groups: dict[str, list[float]] = defaultdict(list)
    for job in jobs:
        if job.wait_s is not None:
            groups[getattr(job, key)].append(job.wait_s)
    return {name: Percentiles.of(values) for name, values in sorted(groups.items())}


def jain_index(used: Mapping[str, float], entitlement: Mapping[str, float]) -> float:
    """Jain's index of used share over entitled share, over tenants entitled to something
    that used something; 1.0 when there is nothing to compare."""
    tenants = [t for t in used if entitlement.get(t, 0) > 0 and used[t] > 0]
    total_used = sum(used[t] for t in tenants)
    total_ent = sum(entitlement[t] for t in tenants)
    if not tenants or total_used <= 0:
        return 1.0
    x = np.array([(used[t] / total_used) / (entitlement[t] / total_ent) for t in tenants])
    return float(x.sum() ** 2 / (len(x) * (x**2).sum()))


def time_average(series: Sequence[tuple[float, float]], end: float) -> float:
    """Average of a step function given as (time, value) changes, from the first time to
    ``end``."""
    if not series or end <= series[0][0]:
        return 0.0
    area = 0.0
    for (t0, v), (t1, _) in zip(series, [*series[1:], (end, 0.0)], strict=True):
        area += v * (min(t1, end) - t0) if t0 < end else 0.0
    return area / (end - series[0][0])
