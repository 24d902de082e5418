"""The Protocol every cluster backend implements (`ClusterBackend`: simulated and kubernetes),
and the capabilities some add, each a Protocol the daemon tests with `isinstance`:
`FencedWrites`, `ConcurrentWrites`, `PodWatching`, `EventClock`, `InferenceLoad`, `FaultInjection`,
`UtilizationSource`, `LogSource`.

The daemon is the only caller. Every method is idempotent where the cluster allows it:
pod names are deterministic per job, attempt and replica (`pod_name`), so a retry after a
crash finds the pod it created before instead of making a second one. Errors the daemon must
tell apart are the exceptions below; anything else is a transient failure to retry with backoff.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from datetime import datetime
from enum import StrEnum
from typing import Protocol, runtime_checkable

# Variables Gantry sets on every pod (the rendezvous of distributed jobs) or that steer the GPU
# runtime and the sharing layer: a job setting them could see devices it was not given
# (NVIDIA_VISIBLE_DEVICES=all) or lift its share's limits. The job spec refuses them at
# submission and every backend refuses them again when it renders a pod.
RESERVED_ENV = re.compile(
    r"^(NVIDIA_.*|CUDA_VISIBLE_DEVICES|CUDA_DEVICE_MEMORY_LIMIT.*|CUDA_DEVICE_SM_LIMIT"
    r"|CUDA_DEVICE_MEMORY_SHARED_CACHE|CUDA_DISABLE_CONTROL|GPU_CORE_UTILIZATION_POLICY|HAMI_.*"
    r"|ASCEND_VISIBLE_DEVICES|ASCEND_RT_VISIBLE_DEVICES|LD_PRELOAD|LD_LIBRARY_PATH"
    r"|WORLD_SIZE|RANK|LOCAL_RANK|MASTER_ADDR|MASTER_PORT|GANTRY_.*)\Z"
)


class PodPhase(StrEnum):
    PENDING = "Pending"  # created, not yet bound or not yet started
    RUNNING = "Running"
    SUCCEEDED = "Succeeded"
    FAILED = "Failed"
    UNKNOWN = "Unknown"


class FailureReason(StrEnum):
    """Why a pod ended badly, mapped from what the cluster reports."""

    OOM_KILLED = "OOMKilled"
    EVICTED = "Evicted"
    IMAGE_PULL = "ImagePullFailure"
    START_TIMEOUT = "StartTimeout"  # pods bound but not started within the daemon's deadline
    CRASH_LOOP = "CrashLoopBackOff"
    DEADLINE_EXCEEDED = "DeadlineExceeded"
    NODE_LOST = "NodeLost"
    PREEMPTED = "Preempted"
    REJECTED = "RejectedByKubelet"  # e.g. OutOfnvidia.com/gpu after binding
    ERROR = "Error"  # non-zero exit


@dataclass(frozen=True)
class GpuInfo:
    index: int
    memory_mib: int
    healthy: bool = True
    uuid: str = ""


@dataclass(frozen=True)
class NodeInfo:
    """A node as the cluster reports it."""

    name: str
    flavor: str  # GPU model, e.g. H100-80GB ("" for CPU-only nodes)
    gpus: tuple[GpuInfo, ...]
    cpu_milli: int
    memory_mib: int
    rdma: int = 0
    ready: bool = True
    unschedulable: bool = False  # cordoned in the cluster
    labels: Mapping[str, str] = field(default_factory=dict)
    taints: tuple[tuple[str, str, str], ...] = ()  # (key, value, effect)
    mig: Mapping[str, int] = field(default_factory=dict)  # MIG resource name -> count


@dataclass(frozen=True)
class PodRequest:
    """One replica of a job, placed: everything needed to create and bind its pod."""

    name: str  # deterministic: pod_name(job_id, attempt, replica)
    namespace: str
    job_id: int
    attempt: int
    replica: int
    replicas: int
    node: str
    gpu_indices: tuple[int, ...]  # devices on `node` (whole GPUs), or the one shared device
    gpu_milli: int  # per replica: 1000 x whole GPUs, or the share
    gpu_memory_mib: int | None
    cpu_milli: int
    memory_mib: int
    image: str
    command: tuple[str, ...]
    env: Mapping[str, str]
    priority_class: str
    job_type: str
    grace_period_s: int = 30
    mig_profile: str | None = None  # a MIG slice (e.g. "1g.10gb") instead of gpu_milli
    max_runtime_s: int | None = None  # the pod's activeDeadlineSeconds on Kubernetes
    # Simulated backend only: how long the pod runs, and whether it fails.
    sim_duration_s: float | None = None
    sim_fail: bool = False
    # A pod its user created, held at creation by Gantry's scheduling gate (issue 37): it is
    # admitted (labelled as Gantry's, its gate removed) and bound, never created.
    held: bool = False
    # The uid that held pod had when its job was mirrored ("" if not recorded): a pod under
    # its name with another uid was made again (a LeaderWorkerSet's StatefulSet remakes a
    # preempted group's pods) and is a new workload's, never this job's to admit.
    held_uid: str = ""
    # The object whose controller makes this pod once Gantry admits it ("jobs/<name>": a
    # batch/v1 Job a user created, issue 37). Creating replica 0 admits the object (Gantry's
    # labels on its pod template, unsuspended); `name` stands for the pod until its
    # controller makes it and reconcile adopts it. Nothing is bound here.
    workload: str = ""


@dataclass(frozen=True)
class PodStatus:
    name: str
    namespace: str
    job_id: int
    attempt: int
    replica: int
    node: str | None
    phase: PodPhase
    reason: FailureReason | None = None
    message: str = ""
    deleting: bool = False
    # Why a Pending pod has not started, as the cluster says: a container's waiting reason
    # and message ("ImagePullBackOff: Back-off pulling image ...", "CreateContainerConfigError:
    # secret "x" not found") or a PodScheduled=False condition ("Unschedulable: ..."); "" if
    # none is reported. The daemon fails an attempt whose pods stay Pending past its binding
    # deadline with this cause.
    waiting: str = ""
    # A pod its job's operator makes beside the replicas (a RayJob's submitter, a TrainJob's
    # initializer: the label `gantry.io/companion`, issue 37): never a replica, bound to
    # replica 0's node while its attempt is admitted; "" for every other pod.
    companion: str = ""


class BackendError(Exception):
    """A transient failure (5xx, 429, timeout, connection reset): retry with backoff."""

    def __init__(self, message: str, retry_after_s: float | None = None) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


class BindConflict(Exception):
    """The pod is bound to another node (a lost race), or is being deleted."""

    def __init__(self, message: str, bound_node: str | None = None, deleting: bool = False) -> None:
        super().__init__(message)
        self.bound_node = bound_node
        self.deleting = deleting


def pod_name(job_id: int, attempt: int, replica: int) -> str:
    """Deterministic per job, attempt and replica, so a retried create adopts the pod."""
    return f"gantry-{job_id}-a{attempt}-r{replica}"


@runtime_checkable
class ClusterBackend(Protocol):
    def list_nodes(self) -> Sequence[NodeInfo]:
        """Every node with its GPUs, conditions, labels and taints."""
        ...

    def create_pod(self, pod: PodRequest) -> None:
        """Create the pod unbound (idempotent: an existing pod of that name is adopted)."""
        ...

    def bind_pod(self, namespace: str, name: str, node: str) -> None:
        """Bind to `node`. Already bound to `node` is success; another node is BindConflict."""
        ...

    def delete_pod(self, namespace: str, name: str, grace_period_s: int = 30) -> None:
        """Graceful delete; a pod already gone is success."""
        ...

    def list_pods(self) -> Sequence[PodStatus]:
        """Every pod with `schedulerName: gantry`, in every namespace."""
        ...

    def set_node_unschedulable(self, node: str, unschedulable: bool) -> None:
        """Cordon or uncordon in the cluster."""
        ...


@runtime_checkable
class ProjectNamespaces(Protocol):
    """A cluster whose users create their own workloads in their project's namespace
    (Kubernetes): the daemon makes each project's namespace before its first pod
    (`scheduler.daemon.namespaces`)."""

    def prepare_namespace(self, name: str) -> None:
        """Make the project namespace `name` (and what it holds besides pods), or find it
        Gantry's; a BackendError that `foreign` says is another owner's otherwise."""
        ...

    def foreign(self, error: BackendError) -> bool:
        """Whether `error` says the namespace exists and is not Gantry's."""
        ...


@runtime_checkable
class PodWatching(Protocol):
    """A backend that can wake the daemon when its pods change (Kubernetes: a list/watch)."""

    def watch_pods(self, stop: threading.Event) -> threading.Event:
        """Start watching until `stop` is set; the returned event is set on every change."""
        ...

    def close_watches(self) -> None:
        """Break the open watch streams (after `stop` is set)."""
        ...


@runtime_checkable
class FencedWrites(Protocol):
    """A backend that checks a fence before every try of a write, inside its own retries
    (`scheduler.backends.retry`): the daemon gives it its lease fence."""

    def fenced(self, check: Callable[[], None]) -> AbstractContextManager[None]:
        """While in the block: run `check` before every try of every write; it raises to
        stop the write. Blocks nest (the innermost check holds)."""
        ...


@runtime_checkable
class ConcurrentWrites(Protocol):
    """A backend whose writes are network calls, safe from several threads at once (Kubernetes).
    The daemon sends a cycle's creates and binds concurrently, at most `max_in_flight` at a
    time, each job as soon as it is claimed; the backend paces its own calls (a client-side
    rate) and fences each try (`FencedWrites`). A backend without it is called in order, in
    the daemon's thread (the simulated cluster: in-process, deterministic)."""

    @property
    def max_in_flight(self) -> int:
        """Calls the daemon may have in flight at once (1: in order)."""
        ...

    @property
    def creates_bound(self) -> bool:
        """Whether `create_pod` creates the pod already on `PodRequest.node` (one call per
        pod; `bind_pod` is then not called)."""
        ...


@runtime_checkable
class EventClock(Protocol):
    """A backend whose pods change at known times (the simulated cluster): the daemon wakes
    for the next one instead of waiting out its interval."""

    def next_event_at(self) -> float | None:
        """When (the daemon's clock) the daemon should next look at the pods: the first
        change of a pod by itself it has not listed yet, already past when one came since
        it last listed them; None when none will come."""
        ...


@runtime_checkable
class InferenceLoad(Protocol):
    """A backend that reports each inference job's load, in replicas wanted."""

    def inference_load(self, job_id: int) -> float:
        """The replicas job `job_id` needs now (fractional; the daemon rounds up)."""
        ...


@runtime_checkable
class FaultInjection(Protocol):
    """A backend whose nodes can be failed and healed on an admin's request (simulated)."""

    def fail_node(self, node: str, message: str = ...) -> None: ...

    def heal_node(self, node: str) -> None: ...

    def node_failed(self, node: str) -> bool: ...


@dataclass(frozen=True)
class DeviceUtilization:
    """One device's reading as a backend that knows it reports it (fields as in NVML)."""

    node: str
    index: int
    utilization_pct: float
    memory_used_mib: int | None = None
    power_w: float | None = None
    temperature_c: float | None = None
    sm_active_pct: float | None = None


@runtime_checkable
class UtilizationSource(Protocol):
    """A backend that produces its devices' readings itself (the simulated cluster). On a real
    cluster the node agents report them instead (`/api/v1/nodes/report/`)."""

    def device_readings(self) -> Sequence[DeviceUtilization]:
        """Every device of every ready node, as read now."""
        ...


@dataclass(frozen=True)
class LogTarget:
    """One pod whose log is asked for, with what a backend that makes logs up (the simulated
    cluster) needs to write them: everything comes from the allocation and the job rows, so
    any process can read a log without the daemon's memory."""

    namespace: str
    pod: str
    job_id: int
    attempt: int
    replica: int
    job_type: str
    started_at: datetime  # when the pod was bound (else when it was placed)
    ended_at: datetime | None  # None: still running
    # How the attempt ended: "running", "succeeded", "failed", "oom" or "stopped"
    # (preempted, cancelled or requeued).
    outcome: str = "running"
    # The pod's node, as Gantry names it (`<cluster>:<node>` outside the home cluster): with
    # several clusters, which cluster's log to read (scheduler/backends/federated/logs.py).
    node: str = ""


@dataclass(frozen=True)
class LogLine:
    at: datetime | None  # when the container wrote it, where the backend knows
    text: str


@dataclass(frozen=True)
class LogPage:
    """Lines in the order written, and an opaque cursor: passed back, the next read returns
    only what came after the last of these lines."""

    lines: tuple[LogLine, ...]
    cursor: str


class LogUnavailable(Exception):
    """The pod's log cannot be read, for a reason a person can act on: the pod is gone (its
    log went with it) or its container has not started (being created, pulling its image,
    not bound to a node yet). The message says which."""


@runtime_checkable
class LogSource(Protocol):
    """A backend that can read its pods' logs (both backends; the web and API processes
    build one with `scheduler.backends.factory.log_source`)."""

    def read_log(
        self, target: LogTarget, *, now: datetime, tail: int | None = None, cursor: str = ""
    ) -> LogPage:
        """The last `tail` lines (every line when None), or with a `cursor` the lines after
        it. Raises LogUnavailable or BackendError."""
        ...

    def follow_log(self, target: LogTarget, *, tail: int | None = None) -> Iterator[LogLine]:
        """The last `tail` lines, then each new line as it is written, until the container
        ends. Raises LogUnavailable or BackendError."""
        ...
