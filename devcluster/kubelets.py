"""Nodes without kubelets: their part played through the API, as KWOK does.

`Kubelets` registers nodes (Ready, GPU capacity, GPU feature discovery labels, taints), renews
their leases, moves pods bound to them to Running, ends them as Succeeded or Failed on command
(or after a duration the caller derives from the pod), and finishes graceful deletions the way a
kubelet does: by deleting the pod again with a zero grace period once its containers stopped.

It also misbehaves on command, like real nodes do: a pod can be held Pending with an image pull
back-off, and a node can be lost, after which it stops heartbeating and its pods stay
Terminating forever (nobody is left to confirm that their containers stopped).

Everything goes through the API server with the admin's client; nothing touches etcd. `step()`
does one pass (for tests that want determinism); `run()` repeats it until told to stop.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import urllib3
from kubernetes import client
from kubernetes.client.rest import ApiException

Obj = dict[str, Any]
logger = logging.getLogger(__name__)
LEASE_NAMESPACE = "kube-node-lease"
MANAGED_LABEL = "devcluster.gantry.dev/simulated"  # the nodes this simulator plays


def _now() -> str:
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _micro_now() -> str:
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


@dataclass
class NodeShape:
    gpus: int = 8
    product: str = "NVIDIA-H100-80GB-HBM3"
    gpu_memory_mib: int = 81920
    cpu: str = "96"
    memory: str = "1024Gi"
    pods: str = "110"
    labels: Mapping[str, str] = field(default_factory=dict)
    taints: list[Obj] = field(default_factory=list)


@dataclass
class _Running:
    started: float
    ends_at: float | None  # monotonic; None: runs until told


class Kubelets:
    def __init__(
        self,
        api: client.ApiClient,
        *,
        duration: Callable[[Obj], float | None] = lambda pod: None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.api = api
        self.core: Any = client.CoreV1Api(api)
        self.coordination: Any = client.CoordinationV1Api(api)
        self.duration = duration
        self.clock = clock
        self.nodes: set[str] = set()
        self.lost: set[str] = set()
        self.held: dict[tuple[str, str], str] = {}  # (namespace, name) -> waiting reason
        self.endings: dict[tuple[str, str], tuple[str, int]] = {}  # -> (phase, exit code)
        self.running: dict[tuple[str, str], _Running] = {}
        # Pods whose containers take their time to stop: a deletion waits for `stopped`.
        self.stopping: set[tuple[str, str]] = set()
        self.passes = 0  # steps finished, for tests that wait until the kubelets looked again
        self._passed = threading.Condition()
        self._ip = 0

    # -- nodes -----------------------------------------------------------------------------

    def add_nodes(self, names: Iterable[str], shape: NodeShape | None = None) -> None:
        shape = shape or NodeShape()
        for name in names:
            self._create_node(name, shape)
            self.nodes.add(name)
        self.heartbeat()

    def _create_node(self, name: str, shape: NodeShape) -> None:
        capacity = {"cpu": shape.cpu, "memory": shape.memory, "pods": shape.pods}
        labels = {
            "kubernetes.io/hostname": name,
            "kubernetes.io/os": "linux",
            "kubernetes.io/arch": "amd64",
            MANAGED_LABEL: "true",
            **shape.labels,
        }
        if shape.gpus:
            capacity["nvidia.com/gpu"] = str(shape.gpus)
            labels |= {
                "nvidia.com/gpu.product": shape.product,
                "nvidia.com/gpu.memory": str(shape.gpu_memory_mib),
                "nvidia.com/gpu.count": str(shape.gpus),
            }
        body = {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {"name": name, "labels": labels},
            "spec": {"taints": list(shape.taints)},
        }
        try:
            _drained(self.core.create_node(body, _preload_content=False))
        except ApiException as error:
            if error.status != 409:  # already registered: a restarted simulator adopts it
                raise
        status = {
            "capacity": capacity,
            "allocatable": capacity,
            "conditions": [self._ready_condition(True)],
            "addresses": [{"type": "InternalIP", "address": "10.1.0.1"}],
            "nodeInfo": {
                "kubeletVersion": "devcluster",
                "architecture": "amd64",
                "operatingSystem": "linux",
                "containerRuntimeVersion": "devcluster://1",
                "kernelVersion": "",
                "osImage": "",
                "kubeProxyVersion": "",
                "machineID": "",
                "systemUUID": "",
                "bootID": "",
            },
        }
        _drained(self.core.patch_node_status(name, {"status": status}, _preload_content=False))
        # Admission taints a new node node.kubernetes.io/not-ready:NoSchedule, and only the node
        # lifecycle controller lifts it once the node reports Ready: a plane started without
        # that controller (scale runs, where nobody heartbeats thousands of nodes) would keep
        # every node unschedulable. Lift it here as that controller would; the shape's own
        # taints stay.
        taints = {"spec": {"taints": list(shape.taints)}}
        _drained(self.core.patch_node(name, taints, _preload_content=False))

    @staticmethod
    def _ready_condition(ready: bool) -> Obj:
        now = _now()
        return {
            "type": "Ready",
            "status": "True" if ready else "Unknown",
            "reason": "KubeletReady" if ready else "NodeStatusUnknown",
            "message": "devcluster plays this kubelet" if ready else "Kubelet stopped posting",
            "lastHeartbeatTime": now,
            "lastTransitionTime": now,
        }

    def heartbeat(self) -> None:
        """Renew each live node's lease, as a kubelet does every 10 s."""
        for name in sorted(self.nodes - self.lost):
            spec = {
                "holderIdentity": name,
                "leaseDurationSeconds": 40,
                "renewTime": _micro_now(),
            }
            try:
                _drained(
                    self.coordination.patch_namespaced_lease(
                        name, LEASE_NAMESPACE, {"spec": spec}, _preload_content=False
                    )
                )
            except ApiException as error:
                if error.status != 404:
                    raise
                body = {"metadata": {"name": name, "namespace": LEASE_NAMESPACE}, "spec": spec}
                _drained(
                    self.coordination.create_namespaced_lease(
                        LEASE_NAMESPACE, body, _preload_content=False
                    )
                )

    def lose_node(self, name: str) -> None:
        """The node stops answering: NotReady, and its pods never finish terminating."""
        self.lost.add(name)
        status = {"conditions": [self._ready_condition(False)]}
        _drained(self.core.patch_node_status(name, {"status": status}, _preload_content=False))

    # -- pods: commands ----------------------------------------------------------------------

    def hold_pending(self, namespace: str, name: str, reason: str = "ImagePullBackOff") -> None:
        """The pod, once bound, stays Pending with this waiting reason (a bad image)."""
        self.held[(namespace, name)] = reason

    def succeed(self, namespace: str, name: str) -> None:
        self.endings[(namespace, name)] = ("Succeeded", 0)

    def fail(self, namespace: str, name: str, exit_code: int = 1) -> None:
        self.endings[(namespace, name)] = ("Failed", exit_code)

    def keep_terminating(self, namespace: str, name: str) -> None:
        """The pod's containers do not stop yet: once deleted it stays Terminating."""
        self.stopping.add((namespace, name))

    def stopped(self, namespace: str, name: str) -> None:
        """The containers stopped at last: the next pass confirms the deletion."""
        self.stopping.discard((namespace, name))

    def wait_passes(self, count: int, timeout_s: float) -> bool:
        """Until `count` more passes have finished (whatever thread runs them); False when
        `timeout_s` ran out first."""
        with self._passed:
            target = self.passes + count
            return self._passed.wait_for(lambda: self.passes >= target, timeout_s)

    # -- the loop ----------------------------------------------------------------------------

    def step(self) -> int:
        """One pass over the pods on our nodes; returns how many were changed."""
        changed = 0
        for pod in self._bound_pods():
            if self._tend(pod):
                changed += 1
        with self._passed:
            self.passes += 1
            self._passed.notify_all()
        return changed

    def run(
        self, stop: threading.Event, interval_s: float = 0.2, heartbeat_s: float = 10.0
    ) -> None:
        """Step until `stop` is set. A failed pass (the API server restarting, a timeout) is
        logged and the next one tries again, as a kubelet keeps going when its server is away:
        a simulator that died with its thread would leave every later pod Pending."""
        beat = self.clock()
        while not stop.is_set():
            try:
                self.step()
                if self.clock() - beat >= heartbeat_s:
                    self.heartbeat()
                    beat = self.clock()
            except (ApiException, urllib3.exceptions.HTTPError, OSError) as error:
                logger.warning("devcluster kubelets: pass failed (%s); trying again", error)
            stop.wait(interval_s)

    def _bound_pods(self) -> list[Obj]:
        response = self.core.list_pod_for_all_namespaces(
            field_selector="spec.nodeName!=", _preload_content=False
        )
        try:
            items: list[Obj] = json.loads(response.data)["items"]
        finally:
            response.release_conn()
        return [p for p in items if p["spec"].get("nodeName") in self.nodes]

    def _tend(self, pod: Obj) -> bool:
        meta, status = pod["metadata"], pod.get("status") or {}
        key = (meta["namespace"], meta["name"])
        node = pod["spec"]["nodeName"]
        phase = status.get("phase", "Pending")
        if node in self.lost:
            return False  # nobody there to run, end or finish deleting it
        if meta.get("deletionTimestamp"):
            if key in self.stopping:
                return False
            self.running.pop(key, None)
            return self._finish_deletion(pod)
        if phase in ("Succeeded", "Failed"):
            return False
        if key in self.held:
            return self._hold(pod, self.held[key]) if not _waiting(status) else False
        if phase == "Pending":
            return self._start(pod)
        ending = self.endings.pop(key, None)
        running = self.running.get(key)
        if ending is None and running and running.ends_at and self.clock() >= running.ends_at:
            ending = ("Succeeded", 0)
        if ending is not None:
            self.running.pop(key, None)
            self._end(pod, *ending)
            return True
        return False

    def _start(self, pod: Obj) -> bool:
        meta = pod["metadata"]
        key = (meta["namespace"], meta["name"])
        now = _now()
        self._ip += 1
        containers = [
            {
                "name": c["name"],
                "image": c.get("image", ""),
                "imageID": "",
                "ready": True,
                "started": True,
                "restartCount": 0,
                "state": {"running": {"startedAt": now}},
            }
            for c in pod["spec"]["containers"]
        ]
        status = {
            "phase": "Running",
            "startTime": now,
            "hostIP": "10.1.0.1",
            "podIP": f"10.2.{(self._ip >> 8) & 255}.{self._ip & 255}",
            "conditions": [
                {"type": t, "status": "True", "lastTransitionTime": now}
                for t in ("PodScheduled", "Initialized", "ContainersReady", "Ready")
            ],
            "containerStatuses": containers,
        }
        if not self._patch_status(pod, status):
            return False
        seconds = self.duration(pod)
        started = self.clock()
        self.running[key] = _Running(started, None if seconds is None else started + seconds)
        return True

    def _hold(self, pod: Obj, reason: str) -> bool:
        containers = [
            {
                "name": c["name"],
                "image": c.get("image", ""),
                "imageID": "",
                "ready": False,
                "restartCount": 0,
                "state": {"waiting": {"reason": reason, "message": f"devcluster: {reason}"}},
            }
            for c in pod["spec"]["containers"]
        ]
        return self._patch_status(pod, {"phase": "Pending", "containerStatuses": containers})

    def _end(self, pod: Obj, phase: str, exit_code: int) -> None:
        now = _now()
        reason = "Completed" if exit_code == 0 else "Error"
        containers = [
            {
                "name": c["name"],
                "image": c.get("image", ""),
                "imageID": "",
                "ready": False,
                "restartCount": 0,
                "state": {
                    "terminated": {
                        "exitCode": exit_code,
                        "reason": reason,
                        "startedAt": (pod.get("status") or {}).get("startTime", now),
                        "finishedAt": now,
                    }
                },
            }
            for c in pod["spec"]["containers"]
        ]
        ready = [{"type": "Ready", "status": "False", "lastTransitionTime": now}]
        self._patch_status(
            pod, {"phase": phase, "conditions": ready, "containerStatuses": containers}
        )

    def _finish_deletion(self, pod: Obj) -> bool:
        """The containers stopped: confirm the deletion with a zero grace period."""
        meta = pod["metadata"]
        body = {"gracePeriodSeconds": 0, "preconditions": {"uid": meta["uid"]}}
        try:
            _drained(
                self.core.delete_namespaced_pod(
                    meta["name"], meta["namespace"], body=body, _preload_content=False
                )
            )
        except ApiException as error:
            if error.status not in (404, 409):  # gone already, or a new pod of that name
                raise
        return True

    def _patch_status(self, pod: Obj, status: Obj) -> bool:
        meta = pod["metadata"]
        try:
            _drained(
                self.core.patch_namespaced_pod_status(
                    meta["name"], meta["namespace"], {"status": status}, _preload_content=False
                )
            )
        except ApiException as error:
            if error.status == 404:
                return False  # deleted meanwhile
            raise
        return True


def _drained(response: Any) -> None:
    """Read the answer's body before its connection goes back to the pool: one given back
    unread hands its leftover bytes to the next request, which fails on them as a bad status
    line when they arrive after the pool's check (a large node or pod answer)."""
    try:
        response.data  # noqa: B018 - reading is the point
    finally:
        response.release_conn()


def _waiting(status: Mapping[str, Any]) -> bool:
    return any("waiting" in (c.get("state") or {}) for c in status.get("containerStatuses") or ())
