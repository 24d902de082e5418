"""The engine's vocabulary: frozen dataclasses in, frozen dataclasses out.

Units everywhere: GPU in milli-GPU (1000 = one whole device), GPU memory in MiB, CPU in
millicores, memory in MiB, RDMA devices as a count, time in seconds (``Snapshot.now``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum

from scheduler.core.units import LABEL_NVLINK_DOMAIN as LABEL_NVLINK_DOMAIN
from scheduler.core.units import LABEL_RACK as LABEL_RACK
from scheduler.core.units import MILLI_PER_GPU as MILLI_PER_GPU


class JobKind(StrEnum):
    TRAINING = "training"
    FINE_TUNING = "fine-tuning"
    INFERENCE = "inference"
    EVALUATION = "evaluation"
    BATCH = "batch"
    INTERACTIVE = "interactive"


class WaitCode(StrEnum):
    """Why a job is still waiting after a cycle; one code per reason family."""

    BACKOFF = "backoff"
    QUOTA = "quota"
    USER_CAP = "user_cap"
    NO_MATCHING_NODE = "no_matching_node"
    CAPACITY = "capacity"
    FRAGMENTATION = "fragmentation"
    GPU_MEMORY = "gpu_memory"
    RESERVATION = "reservation"
    INVALID = "invalid"


@dataclass(frozen=True, slots=True)
class Device:
    index: int
    memory_mib: int
    healthy: bool = True


@dataclass(frozen=True, slots=True)
class Taint:
    key: str
    value: str = ""
    effect: str = "NoSchedule"


@dataclass(frozen=True, slots=True)
class Toleration:
    """Kubernetes semantics: ``value=None`` means operator Exists, ``effect=None`` any effect."""

    key: str
    value: str | None = None
    effect: str | None = None

    def tolerates(self, taint: Taint) -> bool:
        return (
            self.key == taint.key
            and (self.value is None or self.value == taint.value)
            and (self.effect is None or self.effect == taint.effect)
        )


@dataclass(frozen=True, slots=True)
class Node:
    """A schedulable machine. Topology comes from ``labels`` (NVLink domain, rack)."""

    name: str
    flavor: str
    devices: tuple[Device, ...]
    cpu_milli: int
    memory_mib: int
    rdma: int = 0
    pool: str = "default"
    labels: Mapping[str, str] = field(default_factory=dict)
    taints: tuple[Taint, ...] = ()
    healthy: bool = True
    cordoned: bool = False

    @classmethod
    def with_gpus(
        cls,
        name: str,
        flavor: str,
        gpus: int,
        gpu_memory_mib: int = 81920,
        cpu_milli: int = 128_000,
        memory_mib: int = 1_048_576,
        **kwargs: object,
    ) -> Node:
        """A node of ``gpus`` identical healthy devices; other fields via kwargs."""
        devices = tuple(Device(i, gpu_memory_mib) for i in range(gpus))
        return cls(name, flavor, devices, cpu_milli, memory_mib, **kwargs)  # type: ignore[arg-type]

    @property
    def nvlink_domain(self) -> str:
        return self.labels.get(LABEL_NVLINK_DOMAIN, "")

    @property
    def rack(self) -> str:
        return self.labels.get(LABEL_RACK, "")


@dataclass(frozen=True, slots=True)
class Resources:
    """Per-replica request. ``gpu_milli`` is a multiple of 1000 (whole devices on one node)
    or below 1000 (a share of one device, which must also have ``gpu_memory_mib`` free)."""

    gpu_milli: int = 0
    gpu_memory_mib: int = 0
    cpu_milli: int = 0
    memory_mib: int = 0
    rdma: int = 0

    @property
    def whole_gpus(self) -> int:
        return self.gpu_milli // MILLI_PER_GPU if self.gpu_milli >= MILLI_PER_GPU else 0

    @property
    def is_shared(self) -> bool:
        return 0 < self.gpu_milli < MILLI_PER_GPU


@dataclass(frozen=True, slots=True)
class PriorityClass:
    """``counts_against_quota=False`` is best-effort: idle capacity only, preempted by anyone first.
    ``critical`` may preempt jobs still inside the minimum runtime."""

    name: str
    value: int
    may_preempt: bool = True
    preemptible: bool = True
    counts_against_quota: bool = True
    critical: bool = False


@dataclass(frozen=True, slots=True)
class Quota:
    """Per tenant x flavor, in milli-GPU. ``limit=None``: only the cohort bounds borrowing.
    ``lend_limit=None``: the whole guarantee may be lent when idle."""

    guaranteed: int
    limit: int | None = None
    lend_limit: int | None = None


@dataclass(frozen=True, slots=True)
class Tenant:
    """A node of the organisation tree; jobs belong to leaves but any node may hold quota."""

    name: str
    parent: str | None = None
    quotas: Mapping[str, Quota] = field(default_factory=dict)
    weight: float = 1.0
    # flavor -> the most milli-GPU of that flavor one user of this tenant may hold; a flavor
    # absent here has no cap (0 is a cap: nothing).
    user_caps: Mapping[str, int] = field(default_factory=dict)
    # Quotas pinned to one cluster, keyed ``quota.pinned_key(flavor, cluster)``: they hold
    # only for that cluster's nodes (``scheduler.core.pinned``).
    pinned: Mapping[str, Quota] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class JobRequest:
    """A pending job: a gang of ``replicas`` identical replicas, all placed or none.

    Inference elasticity: with ``min_replicas`` set, replicas ``0..min_replicas-1`` are the
    gang and the rest are elastic extras, placed one by one and preempted first.
    ``not_before`` is the retry backoff: the job is not considered earlier.
    """

    id: str
    tenant: str
    priority_class: str
    resources: Resources
    replicas: int = 1
    user: str = ""
    kind: JobKind = JobKind.TRAINING
    min_replicas: int | None = None
    flavors: tuple[str, ...] = ()
    pools: tuple[str, ...] = ()
    tolerations: tuple[Toleration, ...] = ()
    # Several clusters (scheduler.core.clusters): the job runs in one of `clusters` and in
    # one of `regions` (any when empty), and in one of `preferred_clusters` when it fits there.
    clusters: tuple[str, ...] = ()
    regions: tuple[str, ...] = ()
    preferred_clusters: tuple[str, ...] = ()
    submitted_at: float = 0.0
    max_runtime_s: float | None = None
    estimated_runtime_s: float | None = None
    checkpointable: bool = False
    not_before: float = 0.0
    attempt: int = 0

    @property
    def gang_size(self) -> int:
        return self.replicas if self.min_replicas is None else self.min_replicas

    @property
    def runtime_bound_s(self) -> float | None:
        """The enforced bound (max runtime: the job is stopped there); None when nothing
        bounds the runtime. The submitter's estimate is never a bound: nothing enforces it,
        so a short one would let a long job jump the backfill."""
        return self.max_runtime_s

    @property
    def expected_runtime_s(self) -> float | None:
        """For wait-time estimates only: the estimate, else the bound."""
        return (
            self.estimated_runtime_s if self.estimated_runtime_s is not None else self.max_runtime_s
        )


@dataclass(frozen=True, slots=True)
class DeviceShare:
    device: int
    milli: int
    memory_mib: int


@dataclass(frozen=True, slots=True)
class ReplicaAssignment:
    replica: int
    node: str
    shares: tuple[DeviceShare, ...]
    elastic: bool = False

    @property
    def gpu_milli(self) -> int:
        return sum(s.milli for s in self.shares)


@dataclass(frozen=True, slots=True)
class RunningJob:
    """A job holding devices. ``displaced`` lists the jobs it preempted when it started,
    so that their retries cannot preempt it straight back (no ping-pong). ``started`` is
    False while its pods have not started (placed, being bound, or stuck before their
    containers run): it has done no work to lose, so the minimum runtime does not protect it."""

    job: JobRequest
    flavor: str
    assignments: tuple[ReplicaAssignment, ...]
    started_at: float
    last_checkpoint_at: float | None = None
    displaced: tuple[str, ...] = ()
    started: bool = True
    # Its job no longer runs (preempted or requeued: its pods stopping): it holds its devices
    # until they are gone, but its tenant no longer borrows them (``CycleContext.leaving``).
    leaving: bool = False

    @property
    def gpu_milli(self) -> int:
        return sum(a.gpu_milli for a in self.assignments)


@dataclass(frozen=True, slots=True)
class Snapshot:
    """Everything one cycle may look at. ``decayed_usage`` is each tenant's historical
    GPU usage in milli-GPU-seconds, decayed with the profile's half-life
    (see ``order.decay_usage``). ``nominated``: see ``core.nomination``."""

    now: float
    nodes: tuple[Node, ...]
    tenants: tuple[Tenant, ...]
    priority_classes: tuple[PriorityClass, ...]
    running: tuple[RunningJob, ...] = ()
    pending: tuple[JobRequest, ...] = ()
    decayed_usage: Mapping[str, float] = field(default_factory=dict)
    # The placements the last cycle made for pending jobs that wait for their victims'
    # pods to stop: the room those free is held for them (``core.nomination``).
    nominated: tuple[Placement, ...] = ()


@dataclass(frozen=True, slots=True)
class Placement:
    """Start (or grow) ``job_id`` with these replicas; ``victims`` lists the jobs preempted for it
    the placement relies on, which must be gone before binding."""

    job_id: str
    flavor: str
    assignments: tuple[ReplicaAssignment, ...]
    victims: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class Preemption:
    """Stop ``replicas`` of ``job_id`` (all of them when ``whole_job``) for ``preemptor``."""

    job_id: str
    preemptor: str
    replicas: tuple[int, ...]
    whole_job: bool
    reason: str
    work_lost_gpu_s: float
    cause: PreemptionCause | None = None


@dataclass(frozen=True, slots=True)
class Reservation:
    """Devices held for a blocked head job from ``start_at`` (expected)."""

    job_id: str
    flavor: str
    start_at: float
    devices: tuple[tuple[str, int], ...]


class PreemptionCause(StrEnum):
    """Why a victim gives way: what a history and a reason say of it."""

    RECLAIM = "reclaim"  # another tenant's borrowed GPUs go back to their lender
    PRIORITY = "priority"  # a job of the same tenant and a lower class
    BEST_EFFORT = "best_effort"  # a best-effort job, of anyone
    ELASTIC = "elastic"  # inference replicas above their minimum


@dataclass(frozen=True, slots=True)
class PlannedPreemption:
    """A preemption the engine means to make for a waiting job, once ``victims`` may give
    way at ``at`` (they leave their minimum runtime). ``tenant``: the job's; ``tenants``:
    the victims' tenants other than the job's own (those a reclaim takes back from);
    ``milli``: what the victims hold."""

    at: float
    tenant: str
    flavor: str
    cause: PreemptionCause
    victims: tuple[str, ...]
    tenants: tuple[str, ...]
    milli: int


@dataclass(frozen=True, slots=True)
class WaitReason:
    job_id: str
    code: WaitCode
    message: str
    plan: PlannedPreemption | None = None


@dataclass(frozen=True, slots=True)
class CycleResult:
    placements: tuple[Placement, ...]
    preemptions: tuple[Preemption, ...]
    reservations: tuple[Reservation, ...]
    waiting: tuple[WaitReason, ...]

    def reason_for(self, job_id: str) -> WaitReason | None:
        return next((w for w in self.waiting if w.job_id == job_id), None)

    def placement_for(self, job_id: str) -> Placement | None:
        return next((p for p in self.placements if p.job_id == job_id), None)
