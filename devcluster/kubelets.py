"""Nodes without kubelets: their part played through the API, as KWOK does.

`Kubelets` registers nodes (Ready, GPU capacity, GPU feature discovery labels, taints), renews
their leases, moves pods bound to them to Running, ends their containers on command (or after a
duration the caller derives from the pod: by default its `devcluster.gantry.dev/run-seconds`
annotation, with the exit code of `devcluster.gantry.dev/exit-code`, as KWOK's stage annotations
do), and finishes graceful deletions the way a kubelet does: by deleting the pod again with a
zero grace period once its containers stopped.

A container that exits does what the pod's restartPolicy says, so that the Job controller sees
what it would see on a real node: under `Never` the pod ends Succeeded or Failed; under
`OnFailure` a failure restarts the container (restartCount goes up, the exit is its lastState,
the pod stays Running) and a success ends the pod; under `Always` (the default) every exit
restarts it.

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
import math
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import urllib3
from kubernetes import client
from kubernetes.client.rest import ApiException

from devcluster.fanout import Fanout
from devcluster.heartbeats import RENEW_EVERY_S, heartbeat_round

Obj = dict[str, Any]
logger = logging.getLogger(__name__)
MANAGED_LABEL = "devcluster.gantry.dev/simulated"  # the nodes this simulator plays
RUN_SECONDS = "devcluster.gantry.dev/run-seconds"  # a pod's containers exit after this long
EXIT_CODE = "devcluster.gantry.dev/exit-code"  # and with this code (0 unless it says)


def _now() -> str:
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def annotated_duration(pod: Obj) -> float | None:
    """How long the pod's containers run before they exit: its RUN_SECONDS annotation, or
    None (until told) when it has none or one that is not a number of seconds."""
    value = (pod["metadata"].get("annotations") or {}).get(RUN_SECONDS)
    try:
        seconds = float(value) if value is not None else None
    except ValueError:
        return None
    return seconds if seconds is not None and seconds >= 0 else None


def annotated_exit_code(pod: Obj) -> int:
    value = (pod["metadata"].get("annotations") or {}).get(EXIT_CODE, "0")
    try:
        return int(value)
    except ValueError:
        return 1  # a command that cannot even say how it ended has failed


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
        duration: Callable[[Obj], float | None] = annotated_duration,
        clock: Callable[[], float] = time.monotonic,
        renew_every_s: float = RENEW_EVERY_S,
    ) -> None:
        self.api = api
        self.core: Any = client.CoreV1Api(api)
        self.coordination: Any = client.CoordinationV1Api(api)
        self.duration = duration
        self.clock = clock
        # A kubelet's 10 s by default; thousands of nodes may take longer (bench.k8s_peers):
        # the node lifecycle controller only asks that a lease be younger than its grace period.
        self.renew_every_s = renew_every_s
        self.nodes: set[str] = set()
        self.lost: set[str] = set()
        self.held: dict[tuple[str, str], str] = {}  # (namespace, name) -> waiting reason
        self.endings: dict[tuple[str, str], int] = {}  # -> the exit code its containers end with
        self.running: dict[tuple[str, str], _Running] = {}
        # The wall time (time.time()) each Job's first pod was started, by the Job's name (its
        # pods' `batch.kubernetes.io/job-name`): benchmarks measure creation to running by it.
        self.first_running: dict[str, float] = {}
        # Pods whose containers take their time to stop: a deletion waits for `stopped`.
        self.stopping: set[tuple[str, str]] = set()
        self.passes = 0  # steps finished, for tests that wait until the kubelets looked again
        self._passed = threading.Condition()
        self._ip = 0
        self._rounds = 0  # heartbeat rounds done: whose status is reported is turn by turn

    def reconnect(self) -> None:
        """A client of its own, in a process forked from the one that made this: the parent's
        pooled connections stay the parent's."""
        self.api = client.ApiClient(self.api.configuration)
        self.core = client.CoreV1Api(self.api)
        self.coordination = client.CoordinationV1Api(self.api)

    # -- nodes -----------------------------------------------------------------------------

    def add_nodes(self, names: Iterable[str], shape: NodeShape | None = None) -> None:
        """Register the nodes and make their leases. Registering thousands takes minutes,
        longer than the node lifecycle controller waits for a node's next sign of life: run
        `beat` in a thread meanwhile (bench.k8s_peers does), and call this from several threads
        at once if need be."""
        shape = shape or NodeShape()
        added = []
        for name in names:
            self._create_node(name, shape)
            self.nodes.add(name)
            added.append(name)
        self._beat(added, not_ready=())

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
        """One round of what kubelets do every 10 s (devcluster.heartbeats), for every live
        node, sent concurrently: 5,000 nodes' round must fit well within the node lifecycle
        controller's grace period. ApiException after the round names the nodes whose
        heartbeat failed; the others were renewed."""
        live = sorted(self.nodes - self.lost)
        self._beat(live, not_ready=self._not_ready(live))

    def _beat(self, names: list[str], not_ready: Iterable[str]) -> None:
        self._rounds += 1
        fanout = Fanout(self.api.configuration)
        failed = heartbeat_round(fanout, names, self._rounds - 1, not_ready)
        if failed:
            (name, answer), more = failed[0], len(failed) - 1
            raise ApiException(
                status=answer.status,
                reason=f"heartbeat of {name} (and {more} more) failed: {answer.body[:300]!r}",
            )

    def _not_ready(self, live: list[str]) -> set[str]:
        """The live nodes the node lifecycle controller marked (Ready not True): a kubelet
        reports its status at once when the server's differs from its own, not in its turn.
        One list from the watch cache (resourceVersion 0) costs the server less than the GET
        of its own node that every real kubelet makes each round."""
        response = self.core.list_node(
            label_selector=f"{MANAGED_LABEL}=true", resource_version="0", _preload_content=False
        )
        try:
            items: list[Obj] = json.loads(response.data).get("items") or []
        finally:
            response.release_conn()
        wanted = set(live)
        return {
            node["metadata"]["name"]
            for node in items
            if node["metadata"]["name"] in wanted and not _ready(node)
        }

    def beat(
        self,
        stop: threading.Event,
        interval_s: float | None = None,
        on_round: Callable[[float], None] = lambda seconds: None,
    ) -> None:
        """Heartbeat rounds every `interval_s` (`renew_every_s` unless given) until `stop` is
        set, in a thread of its own so that a long pass over the pods never delays a lease; on
        a ticker as a kubelet's: a round starts `interval_s` after the last one started, or as
        soon as it ended if it took longer, so that a lease's age stays below the longer of the
        two. `on_round` hears how long each round that succeeded took. A failed round is
        logged and the next one tries again."""
        every = self.renew_every_s if interval_s is None else interval_s
        began = self.clock()
        while not stop.wait(max(0.0, began + every - self.clock())):
            began = self.clock()
            try:
                self.heartbeat()
                on_round(self.clock() - began)
            except (ApiException, urllib3.exceptions.HTTPError, OSError) as error:
                logger.warning("devcluster kubelets: heartbeat failed (%s); trying again", error)

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
        """The pod's containers exit 0 (a pod under restartPolicy Always restarts them)."""
        self.endings[(namespace, name)] = 0

    def fail(self, namespace: str, name: str, exit_code: int = 1) -> None:
        """The pod's containers exit with `exit_code` (restarted unless its policy is Never)."""
        self.endings[(namespace, name)] = exit_code

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
        self, stop: threading.Event, interval_s: float = 0.2, heartbeat_s: float | None = None
    ) -> None:
        """Step until `stop` is set, the heartbeats beside in a thread of their own. A failed
        pass (the API server restarting, a timeout) is logged and the next one tries again, as
        a kubelet keeps going when its server is away: a simulator that died with its thread
        would leave every later pod Pending."""
        # heartbeat_s infinite: the caller renews the leases itself (bench.k8s_kueue).
        beats = threading.Thread(
            target=self.beat, args=(stop, heartbeat_s), name="devcluster-heartbeats", daemon=True
        )
        if heartbeat_s is None or math.isfinite(heartbeat_s):
            beats.start()
        try:
            while not stop.is_set():
                try:
                    self.step()
                except (ApiException, urllib3.exceptions.HTTPError, OSError) as error:
                    logger.warning("devcluster kubelets: pass failed (%s); trying again", error)
                stop.wait(interval_s)
        finally:
            if beats.is_alive():
                beats.join()

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
        running = self.running.get(key) or self._adopt(pod)
        exit_code = self.endings.pop(key, None)
        if exit_code is None and running.ends_at is not None and self.clock() >= running.ends_at:
            exit_code = annotated_exit_code(pod)
        if exit_code is None:
            return False
        policy = pod["spec"].get("restartPolicy") or "Always"
        if policy == "Never" or (policy == "OnFailure" and exit_code == 0):
            self.running.pop(key, None)
            self._end(pod, "Succeeded" if exit_code == 0 else "Failed", exit_code)
        else:
            self._restart(pod, exit_code)
        return True

    def _adopt(self, pod: Obj) -> _Running:
        """A Running pod this simulator did not start (it was restarted): its containers are
        taken to have started now."""
        meta = pod["metadata"]
        return self._track((meta["namespace"], meta["name"]), pod)

    def _track(self, key: tuple[str, str], pod: Obj) -> _Running:
        seconds = self.duration(pod)
        started = self.clock()
        running = _Running(started, None if seconds is None else started + seconds)
        self.running[key] = running
        return running

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
        self._track(key, pod)
        job = (meta.get("labels") or {}).get("batch.kubernetes.io/job-name")
        if job:
            self.first_running.setdefault(job, time.time())
        return True

    def _restart(self, pod: Obj, exit_code: int) -> None:
        """The containers exited and the kubelet starts them again at once (no back-off: the
        Job controller counts the restarts either way)."""
        now = _now()
        previous = {c["name"]: c for c in (pod.get("status") or {}).get("containerStatuses") or ()}
        containers = []
        for c in pod["spec"]["containers"]:
            before = previous.get(c["name"]) or {}
            started = ((before.get("state") or {}).get("running") or {}).get("startedAt", now)
            containers.append(
                {
                    "name": c["name"],
                    "image": c.get("image", ""),
                    "imageID": "",
                    "ready": True,
                    "started": True,
                    "restartCount": int(before.get("restartCount", 0)) + 1,
                    "state": {"running": {"startedAt": now}},
                    "lastState": {"terminated": _terminated(exit_code, started, now)},
                }
            )
        if self._patch_status(pod, {"containerStatuses": containers}):
            meta = pod["metadata"]
            self._track((meta["namespace"], meta["name"]), pod)

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
        previous = {c["name"]: c for c in (pod.get("status") or {}).get("containerStatuses") or ()}
        containers = []
        for c in pod["spec"]["containers"]:
            before = previous.get(c["name"]) or {}
            started = ((before.get("state") or {}).get("running") or {}).get("startedAt")
            started = started or (pod.get("status") or {}).get("startTime", now)
            containers.append(
                {
                    "name": c["name"],
                    "image": c.get("image", ""),
                    "imageID": "",
                    "ready": False,
                    "started": False,
                    "restartCount": int(before.get("restartCount", 0)),
                    "state": {"terminated": _terminated(exit_code, started, now)},
                }
            )
        not_ready = [
            {"type": t, "status": "False", "reason": "PodCompleted", "lastTransitionTime": now}
            for t in ("ContainersReady", "Ready")
        ]
        self._patch_status(
            pod, {"phase": phase, "conditions": not_ready, "containerStatuses": containers}
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


def _ready(node: Obj) -> bool:
    conditions = (node.get("status") or {}).get("conditions") or ()
    return any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)


def _terminated(exit_code: int, started: str, finished: str) -> Obj:
    reason = "Completed" if exit_code == 0 else "Error"
    return {"exitCode": exit_code, "reason": reason, "startedAt": started, "finishedAt": finished}


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
