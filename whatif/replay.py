"""Rebuild the last N days from the database and replay them twice (docs/what-if.md).

1. jobs: those submitted in the window, and those still holding GPUs when it opened (they
   arrive at its start with the time they had left); cancelled jobs that never started are
   left out. Each keeps its tenant, priority class, size, allowed flavors and pools. Its
   duration is its last attempt's run from the allocations (a job still running: so far);
   a job that never started runs for its max runtime, else GANTRY_WHATIF_DEFAULT_RUNTIME_S.
   At most GANTRY_WHATIF_MAX_JOBS are replayed, the earliest first, and the result says so.
2. cluster: the nodes present now, all healthy and schedulable; the tenants' quotas and the
   priority classes as they are today, and again with the proposed changes. An expansion
   (whatif/inventory.py) changes the proposed side's nodes, and scales the jobs of both
   sides to a forecast's demand.
3. replay both in `scheduler.sim` with the scheduler's profile, each side half the progress.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db.models import Exists, OuterRef, Q

from scheduler.clusters.selectors import cluster_labels
from scheduler.core import Profile
from scheduler.models import Allocation, Job, JobState
from scheduler.profiles.files import built_in, read_profile
from scheduler.sim import Cluster, SimConfig, Simulation, WorkloadJob
from scheduler.snapshot.rows import ROW_FIELDS
from scheduler.snapshot.translate import (
    QUOTA_VALUES,
    Organisation,
    job_request,
    load_nodes,
    priority_classes,
    quota_key,
    tenants_from_quotas,
)
from tenants.models import PriorityClass as PriorityClassRow
from tenants.models import Quota as QuotaRow
from tenants.models import Tenant
from whatif.inventory import apply_inventory, scale_demand
from whatif.summary import summarise

Progress = Callable[[int, str], None]  # (percent, what it is doing)
LEFT_OUT = (JobState.PENDING_APPROVAL, JobState.REJECTED)  # never ran, never will
ORG_KINDS = ("quota", "priority_class")  # the changes to the organisation, not the inventory


@dataclass(frozen=True)
class Workload:
    jobs: list[WorkloadJob]
    found: int  # jobs the window holds; more than replayed when capped
    horizon_s: float  # the replayed span: the window, or up to the last replayed arrival


def replay(
    *,
    changes: Sequence[Mapping[str, Any]],
    window_days: int,
    now: datetime,
    progress: Progress,
    every_cycles: int = 50,
) -> dict[str, Any]:
    """Steps 1-3 of the module docstring; the results to keep in `WhatIf.results`."""
    start = now - timedelta(days=window_days)
    progress(0, "reading the jobs of the window")
    work = workload(start, now)
    capped = work.found > len(work.jobs)  # before an expansion's scaling adds or drops jobs
    # An expansion's forecast demand is replayed on both sides (whatif/inventory.py).
    work = replace(work, jobs=scale_demand(work.jobs, changes))
    nodes = tuple(replace(n, healthy=True, cordoned=False) for n in load_nodes()[0].values())
    rows = _organisation_rows()
    sides = {}
    for k, (side, proposed) in enumerate((("baseline", ()), ("proposed", changes))):
        tenants, classes = organisation(rows, [c for c in proposed if c["kind"] in ORG_KINDS])
        inventory = apply_inventory(nodes, proposed)  # the proposed side's only
        label = "today's settings" if side == "baseline" else "the proposed settings"
        cluster = Cluster(inventory, tenants, classes)
        report = _run(work, cluster, label, 50 * k, progress, every_cycles)
        sides[side] = summarise(report, work.horizon_s)
        sides[side]["capacity_gpus"] = float(sum(len(n.devices) for n in inventory))
    cap = settings.GANTRY_WHATIF_MAX_JOBS
    return {
        "window_start": start.isoformat(),
        "window_end": now.isoformat(),
        "jobs_found": work.found,
        "jobs_replayed": len(work.jobs),
        "capped": capped,
        "cap": cap,
        "capacity_gpus": float(sum(len(n.devices) for n in nodes)),
        **sides,
    }


def _run(
    work: Workload,
    cluster: Cluster,
    label: str,
    base: int,
    progress: Progress,
    every_cycles: int,
) -> Any:
    end = max(work.horizon_s, 1.0)

    def heard(now: float, cycles: int) -> None:
        if cycles % every_cycles == 0:
            done = min(now / end, 1.0)
            progress(base + int(49 * done), f"replaying {label}: day {now / 86400:.1f}")

    progress(base, f"replaying {label}")
    simulation = Simulation(
        work.jobs, cluster, profile(), (), SimConfig(tick_s=300.0), progress=heard
    )
    return simulation.run()


def profile() -> Profile:
    path = settings.GANTRY_SCHEDULER_PROFILE
    return (read_profile(path) if path else built_in()).profile


# --- 1. jobs ------------------------------------------------------------------------------


def workload(start: datetime, now: datetime) -> Workload:
    held_at_start = Allocation.objects.filter(job=OuterRef("pk"), started_at__lt=start).filter(
        Q(ended_at__isnull=True) | Q(ended_at__gt=start)
    )
    jobs = (
        Job.objects.exclude(state__in=LEFT_OUT)
        .exclude(state=JobState.CANCELLED, started_at__isnull=True)
        .filter(Q(queued_at__gte=start, queued_at__lt=now) | Q(Exists(held_at_start)))
    )
    found = jobs.count()
    rows = list(
        jobs.order_by("queued_at", "id").values(*ROW_FIELDS)[: settings.GANTRY_WHATIF_MAX_JOBS]
    )
    runs = _last_runs([r["id"] for r in rows], start, now)
    slugs = dict(Tenant.objects.values_list("id", "slug"))
    classes = {pc["id"]: pc for pc in PriorityClassRow.objects.values("id", "name")}
    default = settings.GANTRY_WHATIF_DEFAULT_RUNTIME_S
    clusters = cluster_labels()
    out = []
    for row in rows:
        arrival = max(0.0, ((row["queued_at"] or start) - start).total_seconds())
        request = replace(
            job_request(row, slugs, classes, clusters),
            submitted_at=arrival,
            not_before=0.0,
            attempt=0,
        )
        duration = runs.get(row["id"]) or float(row["max_runtime_s"] or default)
        out.append(WorkloadJob(request, arrival, duration))
    window = (now - start).total_seconds()
    horizon = max(w.arrival_s for w in out) if found > len(out) and out else window
    return Workload(out, found, horizon)


def _last_runs(ids: list[int], start: datetime, now: datetime) -> dict[int, float]:
    """Job id -> seconds its last attempt ran (from the window's start at the earliest)."""
    spans: dict[int, dict[int, list[datetime]]] = defaultdict(dict)
    for a in Allocation.objects.filter(job_id__any=ids).values(
        "job_id", "attempt", "started_at", "ended_at"
    ):
        began, ended = max(a["started_at"], start), min(a["ended_at"] or now, now)
        span = spans[a["job_id"]].setdefault(a["attempt"], [began, ended])
        span[0], span[1] = min(span[0], began), max(span[1], ended)
    return {
        job: max((spans_of[last][1] - spans_of[last][0]).total_seconds(), 1.0)
        for job, spans_of in spans.items()
        for last in [max(spans_of)]
    }


# --- 2. organisation ----------------------------------------------------------------------


@dataclass(frozen=True)
class OrgRows:
    tenants: list[dict[str, Any]]
    quotas: list[dict[str, Any]]
    classes: list[dict[str, Any]]


def _organisation_rows() -> OrgRows:
    return OrgRows(
        [dict(r) for r in Tenant.objects.values("id", "slug", "parent_id")],
        [
            dict(q)
            for q in QuotaRow.objects.values(
                "tenant__slug", "flavor__name", "cluster__name", *QUOTA_VALUES
            )
        ],
        [
            dict(c)
            for c in PriorityClassRow.objects.values(
                "name", "value", "may_preempt", "preemptible", "counts_against_quota"
            )
        ],
    )


def organisation(rows: OrgRows, changes: Sequence[Mapping[str, Any]]) -> Organisation:
    """The engine's tenants and classes as `scheduler.snapshot.translate` builds them, with
    `changes` applied on top."""
    quotas = {
        (q["tenant__slug"], quota_key(q["flavor__name"], q.get("cluster__name"))): dict(q)
        for q in rows.quotas
    }
    values = {c["name"]: c["value"] for c in rows.classes}
    for change in changes:
        if change["kind"] == "quota":
            key = (change["tenant"], quota_key(change["flavor"], change.get("cluster")))
            base = quotas.get(key) or {"guaranteed_milli": 0, "limit_milli": 0, "weight": 1}
            quotas[key] = {**base, **{k: v for k, v in change.items() if k in QUOTA_KEYS}}
        else:
            values[change["name"]] = change["value"]
    tenants = tenants_from_quotas(rows.tenants, quotas)
    classes = priority_classes({**c, "value": values[c["name"]]} for c in rows.classes)
    return tenants, classes


QUOTA_KEYS = ("guaranteed_milli", "limit_milli", "lend_limit_milli", "weight", "user_limit_milli")
