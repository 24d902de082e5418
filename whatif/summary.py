"""What one side of a what-if found, as plain data kept in `WhatIf.results`.

Pure: a `SimReport` in, a JSON-ready dict out. Every tenant is kept with its raw waits, so
that a viewer's page can name the tenants they may see and fold the rest into one "others"
row with true percentiles (`whatif.present`).
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from scheduler.sim import SimReport
from scheduler.sim.measures import time_average


def summarise(report: SimReport, horizon_s: float) -> dict[str, Any]:
    """Utilization is the allocated share of capacity over the replayed window
    (`horizon_s`), the same span on both sides; fairness is Jain's index of the tenants'
    share of GPU-time over their share of the guarantees in force on that side."""
    capacity = report.capacity_gpus
    allocated = time_average(report.allocation, horizon_s) if horizon_s > 0 else 0.0
    tenants: dict[str, dict[str, Any]] = defaultdict(
        lambda: {"jobs": 0, "waits": [], "never_started": 0, "preemptions": 0}
    )
    for job in report.jobs:
        row = tenants[job.tenant]
        row["jobs"] += 1
        row["preemptions"] += job.preemptions
        if job.wait_s is None:
            row["never_started"] += 1
        else:
            row["waits"].append(round(job.wait_s, 1))
    for name, row in tenants.items():
        row["gpu_hours"] = report.gpu_hours_by_tenant.get(name, 0.0)
        row["borrowed_gpu_hours"] = report.borrowed_gpu_hours.get(name, 0.0)
    return {
        "utilization": allocated / capacity if capacity else 0.0,
        "fairness": report.jain_fairness,
        "preemptions": report.preemptions,
        "borrowed_gpu_hours": sum(report.borrowed_gpu_hours.values()),
        "cycles": report.cycles,
        "tenants": dict(sorted(tenants.items())),
    }
