"""What a viewer sees of a what-if's results: the tenants they may see by name, everyone
else folded into one "others" row (waits pooled, so its percentiles are true ones).

Platform admins and finance see every tenant. Totals over the cluster (utilization, fairness, all
preemptions and borrowing) are shown to all who see the run: they name nobody.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from tenants import access
from whatif.models import WhatIf

SIDES = ("baseline", "proposed")
OTHERS = "others"


def results_for(user: Any, run: WhatIf) -> dict[str, Any] | None:
    if not run.results:
        return None
    results = run.results
    named = _named(user, results)
    rows = []
    for tenant in sorted(named):
        rows.append(
            {"tenant": tenant, **{s: _row([results[s]["tenants"].get(tenant)]) for s in SIDES}}
        )
    rest = {
        s: [row for name, row in results[s]["tenants"].items() if name not in named] for s in SIDES
    }
    if any(rest.values()):
        rows.append({"tenant": OTHERS, **{s: _row(rest[s]) for s in SIDES}})
    totals = {s: {k: v for k, v in results[s].items() if k != "tenants"} for s in SIDES}
    head = {k: v for k, v in results.items() if k not in SIDES}
    return {**head, "totals": totals, "tenants": rows}


def _named(user: Any, results: dict[str, Any]) -> set[str]:
    everyone = {name for s in SIDES for name in results[s]["tenants"]}
    if access.grants_for(user).sees_everything:
        return everyone
    visible = set(
        access.tenants_visible(user).filter(slug__in=everyone).values_list("slug", flat=True)
    )
    return everyone & visible


def _row(parts: list[dict[str, Any] | None]) -> dict[str, Any]:
    kept = [p for p in parts if p]
    waits = [w for p in kept for w in p["waits"]]
    data = np.asarray(waits, dtype=np.float64)
    return {
        "jobs": sum(p["jobs"] for p in kept),
        "started": len(waits),
        "never_started": sum(p["never_started"] for p in kept),
        "mean_wait_s": float(data.mean()) if waits else None,
        "p90_wait_s": float(np.percentile(data, 90)) if waits else None,
        "gpu_hours": sum(p["gpu_hours"] for p in kept),
        "borrowed_gpu_hours": sum(p["borrowed_gpu_hours"] for p in kept),
        "preemptions": sum(p["preemptions"] for p in kept),
    }
