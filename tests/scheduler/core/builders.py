"""Small builders for engine tests: ``make_node("n1", gpus=8, model="H100")`` and friends."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from scheduler.core import Profile, run_cycle
from scheduler.core.types import (
    LABEL_NVLINK_DOMAIN,
    LABEL_RACK,
    CycleResult,
    DeviceShare,
    JobKind,
    JobRequest,
    Node,
    PriorityClass,
    Quota,
    ReplicaAssignment,
    Resources,
    RunningJob,
    Snapshot,
    Taint,
    Tenant,
    Toleration,
)

GPU = 1000
CLASSES = (
    PriorityClass("low", 100),
    PriorityClass("normal", 200),
    PriorityClass("high", 300),
    PriorityClass("critical", 400, critical=True),
    PriorityClass("pinned", 250, preemptible=False),
    PriorityClass("best-effort", 10, may_preempt=False, counts_against_quota=False),
)
# Tests compare placements with and without the FGD scorer; this profile is plain best fit.
BEST_FIT = Profile(score_weights={"GpuFit": 1.0, "TopologyScore": 1.0}, min_runtime_s=0.0)


def make_node(
    name: str,
    gpus: int = 8,
    model: str = "H100",
    *,
    gpu_memory_mib: int = 81920,
    cpu: int = 128_000,
    memory: int = 1_048_576,
    rdma: int = 0,
    pool: str = "default",
    domain: str = "",
    rack: str = "",
    taints: Sequence[Taint] = (),
    healthy: bool = True,
    cordoned: bool = False,
) -> Node:
    labels = {k: v for k, v in ((LABEL_NVLINK_DOMAIN, domain), (LABEL_RACK, rack)) if v}
    return Node.with_gpus(
        name,
        model,
        gpus,
        gpu_memory_mib,
        cpu,
        memory,
        rdma=rdma,
        pool=pool,
        labels=labels,
        taints=tuple(taints),
        healthy=healthy,
        cordoned=cordoned,
    )


def make_job(
    job_id: str,
    tenant: str = "team-a",
    gpus: float = 1,
    *,
    replicas: int = 1,
    priority: str = "normal",
    user: str = "",
    gpu_memory_mib: int = 0,
    cpu: int = 0,
    memory: int = 0,
    rdma: int = 0,
    flavors: Sequence[str] = (),
    pools: Sequence[str] = (),
    tolerations: Sequence[Toleration] = (),
    submitted_at: float = 0.0,
    runtime: float | None = None,
    min_replicas: int | None = None,
    kind: JobKind = JobKind.TRAINING,
    checkpointable: bool = False,
    not_before: float = 0.0,
    attempt: int = 0,
) -> JobRequest:
    """``gpus`` per replica: whole (``4``) or a share (``0.5``)."""
    resources = Resources(round(gpus * GPU), gpu_memory_mib, cpu, memory, rdma)
    return JobRequest(
        job_id,
        tenant,
        priority,
        resources,
        replicas,
        user=user,
        kind=kind,
        min_replicas=min_replicas,
        flavors=tuple(flavors),
        pools=tuple(pools),
        tolerations=tuple(tolerations),
        submitted_at=submitted_at,
        max_runtime_s=runtime,
        checkpointable=checkpointable,
        not_before=not_before,
        attempt=attempt,
    )


def make_running(
    job: JobRequest,
    *placements: tuple[str, Sequence[int]],
    started_at: float = 0.0,
    flavor: str = "H100",
    elastic_from: int | None = None,
    displaced: Sequence[str] = (),
    last_checkpoint_at: float | None = None,
) -> RunningJob:
    """One (node, devices) per replica; each device holds the replica's per-device share."""
    res = job.resources
    per_device = GPU if res.gpu_milli >= GPU else res.gpu_milli
    assignments = tuple(
        ReplicaAssignment(
            r,
            node,
            tuple(DeviceShare(d, per_device, res.gpu_memory_mib or 81920) for d in devs),
            elastic=elastic_from is not None and r >= elastic_from,
        )
        for r, (node, devs) in enumerate(placements)
    )
    return RunningJob(job, flavor, assignments, started_at, last_checkpoint_at, tuple(displaced))


def make_tenants(
    *teams: tuple[str, float, float | None],
    flavor: str = "H100",
    parent: str = "org",
    lend_limits: dict[str, float] | None = None,
    user_caps: dict[str, float] | None = None,
) -> tuple[Tenant, ...]:
    """``(name, guaranteed GPUs, limit GPUs or None)`` under one parent (the cohort)."""
    lend = lend_limits or {}
    caps = user_caps or {}
    out = [Tenant(parent)]
    for name, guaranteed, limit in teams:
        quota = Quota(
            round(guaranteed * GPU),
            None if limit is None else round(limit * GPU),
            None if name not in lend else round(lend[name] * GPU),
        )
        cap = caps.get(name)
        out.append(
            Tenant(
                name,
                parent,
                {flavor: quota},
                user_caps={} if cap is None else {flavor: round(cap * GPU)},
            )
        )
    return tuple(out)


def snapshot(
    nodes: Iterable[Node],
    pending: Iterable[JobRequest] = (),
    running: Iterable[RunningJob] = (),
    *,
    tenants: Sequence[Tenant] | None = None,
    now: float = 1000.0,
    decayed: dict[str, float] | None = None,
) -> Snapshot:
    if tenants is None:
        tenants = make_tenants(("team-a", 64, None), ("team-b", 64, None))
    return Snapshot(
        now,
        tuple(nodes),
        tuple(tenants),
        CLASSES,
        tuple(running),
        tuple(pending),
        decayed or {},
    )


def cycle(snap: Snapshot, profile: Profile = BEST_FIT) -> CycleResult:
    return run_cycle(snap, profile)


def placed_nodes(result: CycleResult, job_id: str) -> list[str]:
    placement = result.placement_for(job_id)
    assert placement is not None, result.reason_for(job_id)
    return [a.node for a in placement.assignments]


def victims(result: CycleResult) -> set[str]:
    return {p.job_id for p in result.preemptions}
