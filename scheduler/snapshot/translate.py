"""Database to engine: the one place where rows become `scheduler.core` types (jobs, nodes,
tenants with their quotas, priority classes, what runs), and the pods the backend creates.
Core ids: a job is `core_job_id(job.pk)`, a tenant its slug, a node its name, a flavor its
name. The daemon's own code speaks of jobs by primary key only: the engine's result comes
back through `decisions`, in primary keys."""

from __future__ import annotations

import logging
import operator
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from django.db.models import F

from scheduler.backends.base import PodRequest, pod_name
from scheduler.backends.workloads import workload_ref
from scheduler.core.clusters import Labels, resolve_placement
from scheduler.core.quota import PIN, pinned_key
from scheduler.core.types import (
    CycleResult,
    Device,
    DeviceShare,
    JobKind,
    JobRequest,
    Placement,
    Preemption,
    PriorityClass,
    Quota,
    ReplicaAssignment,
    Resources,
    RunningJob,
    Taint,
    WaitReason,
)
from scheduler.core.types import Node as CoreNode
from scheduler.core.types import Tenant as CoreTenant
from scheduler.models import (
    HOLDING_STATES,
    ClusterState,
    GpuDevice,
    JobState,
    Node,
)
from scheduler.snapshot.rows import POD_KEYS, SPEC_KEYS, ts
from tenants.models import Quota as QuotaRow
from tenants.models import Tenant

log = logging.getLogger("gantry.daemon")
S = JobState


# Holding states whose pods have not started: the engine may preempt them inside the
# minimum runtime (`RunningJob.started`).
NOT_STARTED = frozenset({S.ADMITTED, S.BINDING})
CLOSED_CLUSTER_STATES = frozenset({ClusterState.CORDONED, ClusterState.LOST})
# A node's taints are stored as [key, value, effect] lists.
TAINT_FIELDS = ("key", "value", "effect")


def load_nodes() -> tuple[dict[str, CoreNode], dict[tuple[str, int], int], dict[str, int]]:
    """The present nodes as the engine sees them; (node name, index) -> device id; node
    name -> id."""
    # A cordoned or lost cluster's nodes take nothing new (docs/multicluster.md).
    rows = list(
        Node.objects.filter(present=True).annotate(cluster_state=F("cluster__state")).values()
    )
    by_id = {r["id"]: r for r in rows}
    per_node: dict[int, list[Device]] = defaultdict(list)
    device_ids: dict[tuple[str, int], int] = {}
    for d in GpuDevice.objects.filter(node__present=True).values(
        "id", "node_id", "index", "memory_mib", "healthy"
    ):
        device = Device(index=d["index"], memory_mib=d["memory_mib"], healthy=d["healthy"])
        per_node[d["node_id"]].append(device)
        device_ids[(by_id[d["node_id"]]["name"], d["index"])] = d["id"]
    nodes = {}
    for r in rows:
        taints = tuple(Taint(**dict(zip(TAINT_FIELDS, t, strict=False))) for t in r["taints"])
        nodes[r["name"]] = CoreNode(
            name=r["name"],
            flavor=r["flavor"],
            devices=tuple(sorted(per_node[r["id"]], key=lambda d: d.index)),
            cpu_milli=r["cpu_milli"],
            memory_mib=r["memory_mib"],
            rdma=r["rdma"],
            pool=r["pool"],
            labels=r["labels"],
            taints=taints,
            healthy=r["ready"] and not r["sim_failed"],
            cordoned=r["cordoned"]
            or r["cluster_unschedulable"]
            or r["cluster_state"] in CLOSED_CLUSTER_STATES,
        )
    return nodes, device_ids, {r["name"]: r["id"] for r in rows}


def quota_key(flavor: str, cluster: str | None) -> str:
    """The engine's key of a quota row: its flavor, or for one pinned to a cluster the
    flavor on that cluster (``scheduler.core.quota.pinned_key``)."""
    return flavor if not cluster else pinned_key(flavor, cluster)


QUOTA_VALUES = (
    "guaranteed_milli",
    "limit_milli",
    "lend_limit_milli",
    "weight",
    "user_limit_milli",
)


def load_tenants() -> tuple[tuple[CoreTenant, ...], dict[int, str]]:
    """Every tenant with its quotas (global and pinned), weight and per-user caps; tenant
    id -> slug."""
    rows = list(Tenant.objects.values("id", "slug", "parent_id"))
    slugs = {r["id"]: r["slug"] for r in rows}
    quotas = {
        (q["tenant__slug"], quota_key(q["flavor__name"], q["cluster__name"])): q
        for q in QuotaRow.objects.values(
            "tenant__slug", "flavor__name", "cluster__name", *QUOTA_VALUES
        )
    }
    return tenants_from_quotas(rows, quotas), slugs


Organisation = tuple[tuple[CoreTenant, ...], tuple[PriorityClass, ...]]


def tenants_from_quotas(
    tenant_rows: Iterable[Mapping[str, Any]], quotas: Mapping[tuple[str, str], Mapping[str, Any]]
) -> tuple[CoreTenant, ...]:
    """The engine's tenants from tenant rows (`id`, `slug`, `parent_id`) and quota rows by
    (tenant slug, ``quota_key``), as the database holds them or a what-if proposes them: a
    tenant's fair-share weight is the largest of its global quotas' weights, its per-user
    caps those its global quotas set; a pinned quota holds a guarantee and a limit."""
    per_tenant: dict[str, dict[str, Quota]] = defaultdict(dict)
    pinned: dict[str, dict[str, Quota]] = defaultdict(dict)
    weights: dict[str, float] = {}
    caps: dict[str, dict[str, int]] = defaultdict(dict)
    for (slug, flavor), q in quotas.items():
        if PIN in flavor:
            pinned[slug][flavor] = Quota(q["guaranteed_milli"], q["limit_milli"])
            continue
        per_tenant[slug][flavor] = Quota(
            q["guaranteed_milli"], q["limit_milli"], q.get("lend_limit_milli")
        )
        weights[slug] = max(weights.get(slug, 0.0), float(q["weight"]))
        if q.get("user_limit_milli") is not None:
            caps[slug][flavor] = q["user_limit_milli"]
    rows = list(tenant_rows)
    parents = {r["id"]: r["slug"] for r in rows}
    return tuple(
        CoreTenant(
            r["slug"],
            parents.get(r["parent_id"]),
            per_tenant.get(r["slug"], {}),
            weights.get(r["slug"], 1.0),
            caps.get(r["slug"], {}),
            pinned.get(r["slug"], {}),
        )
        for r in rows
    )


def job_request(
    row: Mapping[str, Any],
    slugs: Mapping[int, str],
    classes: Mapping[int, Any],
    clusters: Mapping[str, Labels] | None = None,
) -> JobRequest:
    """The engine's view of a job row. `clusters` (name -> labels, `cluster_labels()`) turns
    the clusters a placement names by their labels into names (`resolve_placement`); without
    it, only the names the placement gives (`scheduler.clusters.selectors.cluster_labels`)."""
    spec = {key: row.get(path) for key, path in SPEC_KEYS.items()}
    placement = spec.get("placement") or {}
    required, preferred = resolve_placement(placement, clusters or {})
    inference = row["job_type"] == "inference"
    return JobRequest(
        id=core_job_id(row["id"]),
        tenant=slugs.get(row["tenant_id"], ""),
        priority_class=classes[row["priority_class_id"]]["name"],
        resources=Resources(
            gpu_milli=row["gpu_milli_per_replica"],
            gpu_memory_mib=row["gpu_memory_mib"] or 0,
            cpu_milli=row["cpu_milli"],
            memory_mib=row["memory_mib"],
            rdma=spec["rdma"] or 0,
        ),
        replicas=row["replicas"],
        user=str(row["submitted_by_id"]),
        kind=JobKind(row["job_type"]),
        min_replicas=min(spec.get("min_replicas") or 1, row["replicas"]) if inference else None,
        flavors=tuple(row["flavors"] or ()),
        pools=tuple(spec.get("pools") or ()),
        clusters=required,
        regions=tuple(placement.get("regions") or ()),
        preferred_clusters=preferred,
        submitted_at=ts(row["queued_at"]),
        max_runtime_s=row["max_runtime_s"],
        estimated_runtime_s=spec.get("estimated_runtime_s"),
        checkpointable=bool(spec.get("checkpointable")),
        not_before=ts(row["not_before"]),
        attempt=row["attempt"],
    )


def running_jobs(
    allocations: Sequence[Mapping[str, Any]],
    shares: Mapping[int, tuple[DeviceShare, ...]],
    rows: Mapping[int, dict[str, Any]],
    displaced: Mapping[int, tuple[str, ...]],
    request: Callable[[dict[str, Any]], JobRequest],
    kept: dict[int, tuple[tuple[Any, ...], RunningJob]] | None = None,
) -> tuple[RunningJob, ...]:
    """What runs: one RunningJob per job holding active allocations (its replicas, their
    device shares, when it started), and the jobs it displaced lately. With `kept` (job id
    -> what it was made of, and the RunningJob), a job made of the very same objects as at
    the last call (its JobRequest, allocation rows and shares, displaced jobs, started or
    not) keeps its RunningJob: the cache hands out unchanged rows as the same objects, and
    the engine then finds what runs unchanged by identity. `kept` is brought up to date."""
    per_job: dict[int, list[Any]] = defaultdict(list)
    for a in allocations:
        if a["job_id"] in rows:
            per_job[a["job_id"]].append(a)
    out = []
    made: dict[int, tuple[tuple[Any, ...], RunningJob]] = {}
    for job_id, allocs in sorted(per_job.items()):
        job = request(rows[job_id])
        flavor = allocs[0]["flavor"]  # the first allocation's, as read
        allocs.sort(key=lambda a: a["replica"])
        started = rows[job_id]["state"] not in NOT_STARTED
        leaving = rows[job_id]["state"] not in HOLDING_STATES  # its pods stopping
        inputs = (
            job,
            started,
            leaving,
            displaced.get(job_id, ()),
            *allocs,
            *(shares[a["id"]] for a in allocs),
        )
        old = kept.get(job_id) if kept is not None else None
        if (
            old is not None
            and len(old[0]) == len(inputs)
            and all(map(operator.is_, old[0], inputs))
        ):
            made[job_id] = old
            out.append(old[1])
            continue
        assignments = tuple(
            ReplicaAssignment(
                replica=a["replica"],
                node=a["node__name"],
                shares=shares[a["id"]],
                elastic=a["elastic"],
            )
            for a in allocs
        )
        running = RunningJob(
            job=job,
            flavor=flavor,
            assignments=assignments,
            started_at=min(ts(a["started_at"]) for a in allocs),
            displaced=displaced.get(job_id, ()),
            started=started,
            leaving=leaving,
        )
        made[job_id] = (inputs, running)
        out.append(running)
    if kept is not None:
        kept.clear()
        kept.update(made)
    return tuple(out)


def priority_classes(rows: Iterable[Mapping[str, Any]]) -> tuple[PriorityClass, ...]:
    """The engine's priority classes from their rows. Critical is what may not be preempted."""
    return tuple(
        PriorityClass(
            name=pc["name"],
            value=pc["value"],
            may_preempt=pc["may_preempt"],
            preemptible=pc["preemptible"],
            counts_against_quota=pc["counts_against_quota"],
            critical=not pc["preemptible"],
        )
        for pc in rows
    )


def pod_request(
    row: dict[str, Any], replica: int, node: str, devices: tuple[int, ...]
) -> PodRequest:
    """The pod of `replica` of the job of `row` (a job row as the daemon reads it, with
    `POD_KEYS`) on `node`, given `devices`."""
    spec = {key: row.get(path) for key, path in POD_KEYS.items()}
    sim = spec["simulation"] or {}
    workload = spec["workload"] or {}  # created in Kubernetes by a user (issue 37)
    held = tuple(workload.get("pods") or ())
    uids = tuple(workload.get("uids") or ())
    return PodRequest(
        name=held[replica] if replica < len(held) else pod_name(row["id"], row["attempt"], replica),
        namespace=row["project__namespace"],
        job_id=row["id"],
        attempt=row["attempt"],
        replica=replica,
        replicas=row["replicas"],
        node=node,
        gpu_indices=devices,
        gpu_milli=row["gpu_milli_per_replica"],
        gpu_memory_mib=row["gpu_memory_mib"],
        cpu_milli=row["cpu_milli"],
        memory_mib=row["memory_mib"],
        image=spec["image"] or "",
        command=tuple(spec["command"] or ()),
        env=dict(spec["env"] or {}),
        priority_class=spec["priority_class"] or "",
        job_type=row["job_type"],
        sim_duration_s=sim.get("duration_s"),
        sim_fail=bool(sim.get("fail")),
        held=replica < len(held),
        held_uid=uids[replica] if replica < len(uids) else "",
        workload=workload_ref(workload),
    )


def core_job_id(pk: int) -> str:
    """The engine's id of the job `pk`."""
    return str(pk)


def job_pk(core_id: str) -> int:
    """The primary key of the job the engine calls `core_id`."""
    return int(core_id)


@dataclass(frozen=True)
class Decisions:
    """A cycle's result under the jobs' primary keys: what to place, what to preempt and
    why the others wait. `preemptor_of` maps each victim to the jobs it was preempted for."""

    placements: tuple[tuple[int, Placement], ...]
    preemptions: tuple[tuple[int, Preemption], ...]
    waiting: tuple[tuple[int, WaitReason], ...]
    preemptor_of: dict[int, set[int]]


def decisions(result: CycleResult) -> Decisions:
    preemptor_of: dict[int, set[int]] = defaultdict(set)
    for p in result.preemptions:
        preemptor_of[job_pk(p.job_id)].add(job_pk(p.preemptor))
    return Decisions(
        placements=tuple((job_pk(p.job_id), p) for p in result.placements),
        preemptions=tuple((job_pk(p.job_id), p) for p in result.preemptions),
        waiting=tuple((job_pk(w.job_id), w) for w in result.waiting),
        preemptor_of=dict(preemptor_of),
    )
