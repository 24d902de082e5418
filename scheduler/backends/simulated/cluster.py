"""The simulated cluster: an in-process ClusterBackend on wall-clock time (or any clock).

It lives in the daemon's process. Pods start `start_delay_s` after binding, run for the
job's `simulation.duration_s` (or a default per job type; inference and interactive run until
deleted), then succeed, or fail when the spec asks. A deleted pod is gone after its grace
period (capped by `grace_cap_s`). Failing a node fails its pods with `NodeLost`; the node
reports NotReady until healed. Utilization is synthetic per job type; inference follows a
load curve that the daemon reads as its scaling signal.

Faults for tests: `inject(method, error, times)` makes the next `times` calls of `method`
raise `error` (a BackendError for 500/timeouts, a BindConflict for 409). As a client of a real
API server does, the cluster retries a transient error itself (`scheduler.backends.retry`,
`policy`), fencing each try of a write (`fenced`), so `times` counts tries; `stall(method,
meanwhile)` holds the next call of `method` while something else happens (a lease expires,
another daemon takes over), then serves it, as a stalled API call does. And the ways a real
cluster misbehaves, on command: `never_start(job_id, reason, message)` keeps a job's pods
Pending for ever with a waiting reason (an image that never pulls, a missing secret), as
the kubelet reports it; `partition_node(node)` makes a node unreachable: NotReady, its pods
frozen as last reported, and a graceful deletion of them never completes (Terminating for
ever) until the node heals or the pod is force-deleted (a grace period of 0).
"""

from __future__ import annotations

import functools
import math
import random
import threading
import time
import zlib
from collections.abc import Callable, Iterable, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field, replace
from typing import Any, TypeVar, cast

from scheduler.backends.base import (
    BindConflict,
    DeviceUtilization,
    FailureReason,
    NodeInfo,
    PodPhase,
    PodRequest,
    PodStatus,
)
from scheduler.backends.retry import RetryPolicy, WriteFence, call_with_retry

Method = TypeVar("Method", bound=Callable[..., Any])
# Seconds a job of each type runs when the spec sets no simulation.duration_s;
# None: until deleted (services and notebooks).
DEFAULT_DURATION_S: dict[str, float | None] = {
    "training": 600.0,
    "fine-tuning": 300.0,
    "evaluation": 120.0,
    "batch": 180.0,
    "inference": None,
    "interactive": None,
}
# Mean GPU utilization per job type (inference follows its load; interactive jobs compute
# in bursts: `INTERACTIVE_BURSTS`).
UTILIZATION = {
    "training": 0.92,
    "fine-tuning": 0.85,
    "evaluation": 0.6,
    "batch": 0.7,
    "interactive": 0.08,
}
# Share of device memory a job of each type keeps allocated (PyTorch's caching allocator holds
# what it once took, busy or not).
MEMORY_SHARE = {
    "training": 0.88,
    "fine-tuning": 0.8,
    "evaluation": 0.5,
    "batch": 0.6,
    "inference": 0.65,
    "interactive": 0.3,
}
# Interactive jobs: the share of their 5-minute slots in which someone runs a cell.
INTERACTIVE_BURSTS = 0.2
# Share of batch-like jobs that hang at 0 % (a deadlocked collective, a stuck data loader)
# some minutes after they start, holding their memory: the idle rule's target.
STALL_SHARE = 0.06
# Board power (W) at full load per GPU model family; idle draw is a tenth of it.
TDP_W = {"H100": 700.0, "H200": 700.0, "B200": 1000.0, "A100": 400.0, "L40": 300.0}
# Inference traffic follows the day: lowest at this UTC hour, highest twelve hours later.
INFERENCE_TROUGH_H = 4.0
HOUR_S, DAY_S = 3600.0, 86400.0
# NVML's GPM (SM activity) exists from Hopper on.
GPM_MODELS = ("H100", "H200", "B200", "GH200")


def _unit(*parts: object) -> float:
    """A deterministic number in [0, 1) for `parts` (the cluster's seed first)."""
    return zlib.crc32(":".join(map(str, parts)).encode()) / 2**32


@dataclass
class _Pod:
    request: PodRequest
    created_at: float
    node: str | None = None
    bound_at: float | None = None
    deleted_at: float | None = None
    gone_at: float | None = None
    failed: tuple[float, FailureReason, str] | None = None  # at, reason, message


@dataclass
class _Node:
    info: NodeInfo
    failed_at: float | None = None
    partitioned_at: float | None = None  # unreachable since: pods frozen, deletions hang


def _api(*, write: bool) -> Callable[[Method], Method]:
    """An API call of the simulated cluster: its transient failures retried per the cluster's
    `policy`, and each try of a write fenced first, as `KubernetesBackend._call` does."""

    def wrap(method: Method) -> Method:
        @functools.wraps(method)
        def call(self: SimulatedCluster, *args: Any, **kwargs: Any) -> Any:
            if not self._faults.get(method.__name__):  # nothing injected: one try
                if write and self._fence.check is not None:
                    self._fence.check()
                return method(self, *args, **kwargs)
            return call_with_retry(
                lambda: method(self, *args, **kwargs),
                self.policy,
                sleep=self.retry_sleep,
                rand=self._rand,
                what=method.__name__,
                before_try=self._fence.check if write else None,
            )

        return cast(Method, call)

    return wrap


@dataclass
class SimulatedCluster:
    """See the module docstring. Thread-safe: one lock around the state."""

    nodes: Iterable[NodeInfo]
    clock: Callable[[], float] = time.time
    start_delay_s: float = 1.0
    grace_cap_s: float = 2.0
    durations: dict[str, float | None] = field(default_factory=lambda: dict(DEFAULT_DURATION_S))
    seed: int = 0  # the synthetic utilization (which jobs stall, when notebooks compute)
    policy: RetryPolicy = field(default_factory=RetryPolicy)  # retries of injected failures
    retry_sleep: Callable[[float], None] = time.sleep  # the backoff between them

    def __post_init__(self) -> None:
        self._nodes = {n.name: _Node(n) for n in self.nodes}
        self._pods: dict[str, _Pod] = {}
        self._on_node: dict[str, set[str]] = {}  # node -> names of pods bound there
        self._faults: dict[str, list[Exception]] = {}
        self._stalls: dict[str, list[Callable[[], object]]] = {}
        self._stuck: dict[int, str] = {}  # job id -> why its pods never start
        self._lock = threading.Lock()
        self.calls: dict[str, int] = {}
        self._fence = WriteFence()  # the daemon's lease fence, before every try of a write
        self._rand = random.Random(self.seed).random  # noqa: S311 - backoff jitter
        self._listed_at = -math.inf  # when the pods were last listed (`next_event_at`)

    def fenced(self, check: Callable[[], None]) -> AbstractContextManager[None]:
        """While in the block, run `check` before every try of every write (create, bind,
        delete, cordon)."""
        return self._fence.held(check)

    # --- faults ---------------------------------------------------------------------------

    def inject(self, method: str, error: Exception, times: int = 1) -> None:
        with self._lock:
            self._faults.setdefault(method, []).extend([error] * times)

    def stall(
        self, method: str, meanwhile: Callable[[], object] | None = None, seconds: float = 0.0
    ) -> None:
        """The next call of `method` stalls, as an API call to a loaded server does: before it
        is served, `meanwhile()` runs (on a fake clock: let time pass, another daemon act),
        or the caller waits `seconds` of wall-clock time. Then it is served as usual."""
        with self._lock:
            self._stalls.setdefault(method, []).append(
                meanwhile if meanwhile is not None else (lambda: time.sleep(seconds))
            )

    def stall_point(self, method: str) -> None:
        """Called by each API call before it takes the cluster's lock, so that what runs
        meanwhile may use the cluster."""
        with self._lock:
            queue = self._stalls.get(method)
            wait = queue.pop(0) if queue else None
        if wait is not None:
            wait()

    def _enter(self, method: str) -> None:
        self.calls[method] = self.calls.get(method, 0) + 1
        queue = self._faults.get(method)
        if queue:
            raise queue.pop(0)

    # --- nodes ----------------------------------------------------------------------------

    @_api(write=False)
    def list_nodes(self) -> Sequence[NodeInfo]:
        self.stall_point("list_nodes")
        with self._lock:
            self._enter("list_nodes")
            return [self._listed(n) for n in self._nodes.values()]

    @staticmethod
    def _listed(node: _Node) -> NodeInfo:
        """The node as listed: its info itself while that says the right readiness (a
        frozen object, the same one from list to list while the node does not change)."""
        ready = node.failed_at is None and node.partitioned_at is None
        return node.info if node.info.ready == ready else replace(node.info, ready=ready)

    @_api(write=True)
    def set_node_unschedulable(self, node: str, unschedulable: bool) -> None:
        self.stall_point("set_node_unschedulable")
        with self._lock:
            self._enter("set_node_unschedulable")
            if node in self._nodes:
                state = self._nodes[node]
                state.info = replace(state.info, unschedulable=unschedulable)

    def fail_node(self, node: str, message: str = "node stopped responding") -> None:
        """The node goes NotReady; every pod on it fails with NodeLost."""
        with self._lock:
            now = self.clock()
            state = self._nodes[node]
            if state.failed_at is not None:
                return
            state.failed_at = now
            for pod in self._pods.values():
                if pod.node == node and pod.failed is None and not self._ended(pod, now):
                    pod.failed = (now, FailureReason.NODE_LOST, message)

    def fail_pod(self, name: str, reason: FailureReason, message: str = "") -> None:
        """Tests and demos: the pod ends now with `reason` (OOMKilled, Evicted, ...)."""
        with self._lock:
            self._pods[name].failed = (self.clock(), reason, message)

    def vanish_pod(self, name: str) -> None:
        """Tests: the pod disappears without a trace (deleted behind Gantry's back)."""
        with self._lock:
            self._pods.pop(name, None)

    def heal_node(self, node: str) -> None:
        """The node is back: Ready, and the deletions it could not confirm complete."""
        with self._lock:
            now = self.clock()
            state = self._nodes[node]
            state.failed_at = None
            if state.partitioned_at is not None:
                state.partitioned_at = None
                for pod in self._pods.values():
                    if pod.node == node and pod.gone_at == math.inf:
                        pod.gone_at = now

    def partition_node(self, node: str) -> None:
        """The node stops reporting (a dead kubelet, a cut network): NotReady; its pods keep
        the status they had, and deleting them gracefully never completes."""
        with self._lock:
            state = self._nodes[node]
            if state.partitioned_at is None:
                state.partitioned_at = now = self.clock()
                for pod in self._pods.values():  # deletions in flight are never confirmed
                    if pod.node == node and pod.gone_at is not None and pod.gone_at > now:
                        pod.gone_at = math.inf

    def never_start(
        self,
        job_id: int,
        reason: str = "ImagePullBackOff",
        message: str = 'Back-off pulling image "registry.example/missing:latest"',
    ) -> None:
        """Every pod of `job_id` (any attempt) stays Pending once bound, the kubelet
        reporting `reason: message` for its container, as Kubernetes does for an image that
        never pulls (ImagePullBackOff) or a missing secret (CreateContainerConfigError)."""
        with self._lock:
            self._stuck[job_id] = f"container main: {reason}: {message}"

    def node_failed(self, node: str) -> bool:
        return self._nodes[node].failed_at is not None

    # --- pods -----------------------------------------------------------------------------

    @_api(write=True)
    def create_pod(self, pod: PodRequest) -> None:
        self.stall_point("create_pod")
        with self._lock:
            self._enter("create_pod")
            now = self.clock()
            current = self._pods.get(pod.name)
            if current is not None and current.gone_at is None:
                return  # adopted: the name is deterministic per job, attempt and replica
            self._pods[pod.name] = _Pod(pod, now)

    @_api(write=True)
    def bind_pod(self, namespace: str, name: str, node: str) -> None:
        self.stall_point("bind_pod")
        with self._lock:
            self._enter("bind_pod")
            now = self.clock()
            pod = self._live(name, now)
            if pod is None:
                raise BindConflict(f"pod {name} does not exist", deleting=True)
            if pod.deleted_at is not None:
                raise BindConflict(f"pod {name} is being deleted", deleting=True)
            if pod.node is not None:
                if pod.node == node:
                    return
                raise BindConflict(f"pod {name} is bound to {pod.node}", bound_node=pod.node)
            if node not in self._nodes:
                raise BindConflict(f"node {node} does not exist")
            pod.node, pod.bound_at = node, now
            self._admit(pod, now)
            self._on_node.setdefault(node, set()).add(name)

    def _admit(self, pod: _Pod, now: float) -> None:
        """The kubelet's check: a node that is down, or devices already full, reject it."""
        node = self._nodes[pod.node or ""]
        if node.failed_at is not None:
            pod.failed = (now, FailureReason.NODE_LOST, f"node {node.info.name} is NotReady")
            return
        used: dict[int, int] = {}
        for name in self._on_node.setdefault(node.info.name, set()):
            other = self._pods.get(name)
            if other is None or other is pod or other.node != pod.node or self._ended(other, now):
                continue
            for index in other.request.gpu_indices:
                used[index] = used.get(index, 0) + _per_device(other.request)
        for index in pod.request.gpu_indices:
            if used.get(index, 0) + _per_device(pod.request) > 1000:
                message = f"OutOfnvidia.com/gpu: device {index} of {pod.node} is in use"
                pod.failed = (now, FailureReason.REJECTED, message)
                return

    @_api(write=True)
    def delete_pod(self, namespace: str, name: str, grace_period_s: int = 30) -> None:
        self.stall_point("delete_pod")
        with self._lock:
            self._enter("delete_pod")
            now = self.clock()
            pod = self._live(name, now)
            if pod is None:
                return
            if pod.deleted_at is not None:  # a second delete may only shorten the grace
                if grace_period_s == 0 and pod.gone_at is not None:
                    pod.gone_at = min(pod.gone_at, now)
                return
            pod.deleted_at = now
            ran = pod.bound_at is not None and not self._ended(pod, now)
            pod.gone_at = now + (min(grace_period_s, self.grace_cap_s) if ran else 0.0)
            if ran and grace_period_s > 0 and self._partitioned(pod):
                pod.gone_at = math.inf  # no kubelet confirms the containers are gone

    @_api(write=False)
    def list_pods(self) -> Sequence[PodStatus]:
        self.stall_point("list_pods")
        with self._lock:
            self._enter("list_pods")
            now = self._listed_at = self.clock()
            for name in [
                n for n, p in self._pods.items() if p.gone_at is not None and p.gone_at <= now
            ]:
                gone = self._pods.pop(name)
                self._on_node.get(gone.node or "", set()).discard(name)
            return [self._status(pod, now) for pod in self._pods.values()]

    def _partitioned(self, pod: _Pod) -> bool:
        node = self._nodes.get(pod.node or "")
        return node is not None and node.partitioned_at is not None

    def _live(self, name: str, now: float) -> _Pod | None:
        pod = self._pods.get(name)
        if pod is None or (pod.gone_at is not None and pod.gone_at <= now):
            return None
        return pod

    def _duration(self, request: PodRequest) -> float | None:
        if request.sim_duration_s is not None:
            return request.sim_duration_s
        return self.durations.get(request.job_type, 600.0)

    def _ended(self, pod: _Pod, now: float) -> bool:
        return pod.failed is not None or self._finish_at(pod) <= now

    def _finish_at(self, pod: _Pod) -> float:
        if pod.bound_at is None or pod.request.job_id in self._stuck:
            return math.inf
        duration = self._duration(pod.request)
        return math.inf if duration is None else pod.bound_at + self.start_delay_s + duration

    def _status(self, pod: _Pod, now: float) -> PodStatus:
        request = pod.request
        extra: dict[str, Any] = {}
        node = self._nodes.get(pod.node or "")
        if node is not None and node.partitioned_at is not None:
            now = min(now, node.partitioned_at)  # what the node last reported
        if pod.failed is not None and pod.failed[0] <= now:
            phase = PodPhase.FAILED
            extra = {"reason": pod.failed[1], "message": pod.failed[2]}
        elif pod.bound_at is not None and request.job_id in self._stuck:
            phase = PodPhase.PENDING
            extra = {"waiting": self._stuck[request.job_id]}
        elif pod.bound_at is None or now < pod.bound_at + self.start_delay_s:
            phase = PodPhase.PENDING
        elif self._finish_at(pod) <= now:
            phase = PodPhase.FAILED if request.sim_fail else PodPhase.SUCCEEDED
            if request.sim_fail:
                extra = {
                    "reason": FailureReason.ERROR,
                    "message": "the job's command exited with code 1 (simulated)",
                }
        else:  # utilization is the devices' (`device_readings`), not the pod's
            phase = PodPhase.RUNNING
        return PodStatus(
            request.name,
            request.namespace,
            request.job_id,
            request.attempt,
            request.replica,
            pod.node,
            phase,
            deleting=pod.deleted_at is not None,
            **extra,
        )

    # --- signals --------------------------------------------------------------------------

    def utilization(self, request: PodRequest, now: float, started: float | None = None) -> float:
        """0..1 for a pod running since `started`: training steady and high, inference
        following its load, interactive mostly idle with bursts, and some jobs stalling at 0
        (`stall_at`). Deterministic for the cluster's `seed`."""
        job_id, kind = request.job_id, request.job_type
        stall = self.stall_at(request, started)
        if stall is not None and now >= stall:
            return 0.0
        if kind == "inference":
            return min(1.0, self.inference_load(job_id, now) / max(request.replicas, 1))
        if kind == "interactive":
            slot = int(now // 300)
            if _unit(self.seed, job_id, "burst", slot) < INTERACTIVE_BURSTS:
                return 0.3 + 0.5 * _unit(self.seed, job_id, "load", slot)
            return 0.03 * _unit(self.seed, job_id, "poll", int(now // 30))
        base = UTILIZATION.get(kind, 0.5)
        wobble = 0.05 * math.sin(now / 7.0 + job_id)
        return max(0.0, min(1.0, base + wobble))

    def stall_at(self, request: PodRequest, started: float | None) -> float | None:
        """When the job hangs at 0 %, if it is one of the STALL_SHARE that do: between one
        and ten minutes after it started. Services and notebooks do not stall this way."""
        if started is None or request.job_type in ("inference", "interactive"):
            return None
        if _unit(self.seed, request.job_id, "stall") >= STALL_SHARE:
            return None
        return started + 60.0 + 540.0 * _unit(self.seed, request.job_id, "stall-at")

    def device_readings(self) -> Sequence[DeviceUtilization]:
        """Every device of the nodes that report (not failed, not partitioned), as a node
        agent would read it now: the pods running on it set its load (the busiest of them
        on a shared device), memory and power follow."""
        with self._lock:
            now = self.clock()
            on_device: dict[tuple[str, int], list[tuple[PodRequest, float]]] = {}
            for pod in self._pods.values():
                if pod.node is None or pod.bound_at is None or self._ended(pod, now):
                    continue
                started = pod.bound_at + self.start_delay_s
                if now < started or pod.request.job_id in self._stuck:
                    continue
                for index in pod.request.gpu_indices:
                    on_device.setdefault((pod.node, index), []).append((pod.request, started))
            readings: list[DeviceUtilization] = []
            idle = self.idle
            for node in self._nodes.values():
                if node.failed_at is not None or node.partitioned_at is not None:
                    continue
                info = node.info
                tdp = next((w for family, w in TDP_W.items() if family in info.flavor), 300.0)
                hopper = any(family in info.flavor for family in GPM_MODELS)
                for gpu in info.gpus:
                    pods = on_device.get((info.name, gpu.index))
                    readings.append(
                        self._reading(info.name, gpu.index, gpu.memory_mib, pods, now, tdp, hopper)
                        if pods
                        else idle(info.name, gpu.index, tdp, hopper)
                    )
            return readings

    @staticmethod
    def idle(node: str, index: int, tdp: float, hopper: bool) -> DeviceUtilization:
        """What `_reading` gives for a device no pod runs on (most, on a large cluster)."""
        power = round(tdp * 0.1, 1)
        return DeviceUtilization(node, index, 0.0, 0, power, 32.0, 0.0 if hopper else None)

    def _reading(
        self,
        node: str,
        index: int,
        memory_mib: int,
        pods: list[tuple[PodRequest, float]],
        now: float,
        tdp: float,
        hopper: bool,
    ) -> DeviceUtilization:
        load = max((self.utilization(r, now, started) for r, started in pods), default=0.0)
        memory = sum(MEMORY_SHARE.get(r.job_type, 0.5) * _per_device(r) / 1000 for r, _ in pods)
        return DeviceUtilization(
            node=node,
            index=index,
            utilization_pct=round(100 * load, 1),
            memory_used_mib=int(memory_mib * min(memory, 1.0)),
            power_w=round(tdp * (0.1 + 0.9 * load), 1),
            temperature_c=round(32 + 45 * load, 1),
            sm_active_pct=round(90 * load, 1) if hopper else None,
        )

    def inference_load(self, job_id: int, now: float | None = None) -> float:
        """Load in replicas' worth of traffic, between 0.5 and 4.5 replicas: a day's curve on
        the clock's UTC time of day, lowest at 04:00 and highest at 16:00 (users' hours),
        shifted per job by up to an hour either way (services of different regions) and
        with noise per job and 5-minute slot. Deterministic for the seed, job and time."""
        at = self.clock() if now is None else now
        shift = (_unit(self.seed, job_id, "daily-shift") - 0.5) * 2 * HOUR_S
        hour = ((at + shift) % DAY_S) / HOUR_S
        day = 0.5 - 0.5 * math.cos(2 * math.pi * (hour - INFERENCE_TROUGH_H) / 24)
        noise = 0.4 * (_unit(self.seed, job_id, "traffic", int(at // 300)) - 0.5)
        return max(0.5, min(4.5, 0.7 + 3.6 * day + noise))

    def next_event_at(self) -> float | None:
        """When the daemon should look at the pods next: the first pod end since they were
        last listed (already past when one came meanwhile: look now, as a watch would have
        said), or the next start or disappearance to come; None when nothing will change
        by itself. Starts and disappearances already past are not looked for: a pod seen
        started frees nothing (`scheduler.daemon.phases.go_again`), and the pods the daemon
        deletes at once go while it looks."""
        with self._lock:
            now, seen = self.clock(), self._listed_at
            times = []
            for pod in self._pods.values():
                if pod.gone_at is not None:
                    times.extend([pod.gone_at] if pod.gone_at > now else [])
                elif pod.bound_at is not None and pod.failed is None:
                    start = pod.bound_at + self.start_delay_s
                    times.extend([start] if start > now else [])
                    times.append(self._finish_at(pod))
            unseen = [t for t in times if seen < t < math.inf]
            return min(unseen) if unseen else None


def _per_device(request: PodRequest) -> int:
    return 1000 if request.gpu_milli >= 1000 else request.gpu_milli


# --- inventories ------------------------------------------------------------------------------
