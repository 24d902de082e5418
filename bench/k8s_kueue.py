"""Kueue's own scheduling scenario, run by Kueue and by Gantry on the same real control plane.

    python -m bench.k8s_kueue --fraction 0.1 --json out.json
    python -m bench.k8s_kueue --fraction 0.01 --no-kueue --json out.json   # Gantry only

The scenario is Kueue's scheduler performance baseline (test/performance/scheduler/configs/
baseline/generator.yaml in sigs.k8s.io/kueue, described in bench.kueue_e2e): 5 cohorts x 6
ClusterQueues (20 GPUs nominal each, 100 more borrowable within the cohort; preemption of lower
priorities within a queue, reclaim within the cohort), per queue 350 small workloads (1 GPU,
0.2 s, one every 0.1 s), 100 medium (5 GPUs, 0.5 s, every 0.5 s) and 50 large (20 GPUs as
5 x 4, 1 s, every 1.2 s): 15,000 in all, on 75 nodes of 8 GPUs. `--fraction F` keeps every
queue, node and arrival interval and submits F of each queue's workloads of each class (at
least one), for both schedulers alike.

- **Kueue** (sigs.k8s.io/kueue, built by `python -m devcluster build --peers`) runs as a local
  process against the plane with its CRDs applied and its own certificate management, and
  admits Workloads: a ResourceFlavor, ClusterQueues in cohorts, LocalQueues and
  WorkloadPriorityClasses. As Kueue's own performance runner does, the Workloads are created
  fully specified (queue, priority, pod sets) and no admission webhook is registered: the
  webhook would only default and validate what is already complete, and the API server could
  not reach it through a Service without kube-proxy. A driver here finishes each admitted
  Workload after its duration (the Finished condition) and, like the runner, clears the quota
  reservation of a Workload Kueue evicted (there is no job controller to do it), so that it
  queues again.
- **Gantry** runs the same arrivals through its daemon with the Kubernetes backend: jobs are
  inserted into PostgreSQL at their arrival times by a separate process, pods are created and
  bound through the API, and `devcluster.kubelets.Kubelets` plays the nodes, ending each pod
  after the duration its job's spec put into the pod's environment.

Both report wall time (first arrival to the last workload finished), mean time to admission per
class (creation to first admission) and usage (allocated GPU-time over 600 GPUs x wall). Where
Kueue cannot be built or run, its half says exactly what failed; nothing stands in for it.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import heapq
import json
import multiprocessing
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from bench.daemon_setup import apart
from bench.kueue_e2e import CLASSES, COHORTS, FLAVOR, TEAMS_PER_COHORT
from devcluster import versions
from devcluster.kubelets import Kubelets, NodeShape
from devcluster.plane import (
    SCHEDULER_BURST,
    SCHEDULER_QPS,
    ControlPlane,
    free_port,
    stop_child,
)

PlaneFactory = Callable[[], contextlib.AbstractContextManager[ControlPlane]]
World = tuple[dict[str, Any], dict[str, Any], Any]  # Gantry's teams, classes and backend
Say = Callable[[str], None]

NODES, GPUS_PER_NODE = 75, 8
GPU = "nvidia.com/gpu"
PRODUCT = "NVIDIA-H100-80GB-HBM3"  # the simulated nodes' GFD product, Gantry's flavor FLAVOR
# Threads creating the arrivals' objects, in each half alike.
CREATORS = 8
DURATION_ENV = "BENCH_DURATION_S"  # the job's duration, carried to its pod by the job's env
GROUP, VERSION = "kueue.x-k8s.io", "v1beta2"
KUEUE_NAMESPACE = "kueue-system"
# Kueue v0.17.0 reads a metrics certificate here, a path its code fixes (cmd/kueue/main.go),
# whenever its internal certificate management is off, and exits when it is missing; with
# metrics off (`bindAddress: "0"`) it is read, never served.
METRICS_CERT_DIR = Path("/etc/kueue/metrics/certs")
# The CRDs Kueue's installation gives a conversion webhook (config/components/crd/patches):
# its certificate manager injects a CA into them and waits until it could.
CONVERTED = ("localqueues", "clusterqueues", "cohorts", "workloads", "multikueueclusters")
# Kueue's field managers, as its performance runner uses them to end and requeue Workloads.
ADMISSION_MANAGER = "kueue-admission"
FINISHED_MANAGER = "kueue-job-controller-Finished"
ADMISSION_CONDITIONS = (
    "QuotaReserved",
    "BlockedOnPreemptionGates",
    "Evicted",
    "Admitted",
    "Preempted",
    "Requeued",
    "DeactivationTarget",
    "Finished",
)
DEFAULT_DATABASE_URL = "postgres://postgres@127.0.0.1:5432/gantry_h6_kueue"
READY_TIMEOUT_S = 120.0
KUEUE_LEFT_OUT = (
    "left out: Kueue's cold build takes about 15 minutes on two cores, so it is opt-in "
    "(make control-plane-peers, or python -m devcluster build --peers) and CI runs Gantry's "
    "half alone"
)


def _say(message: str) -> None:
    print(f"k8s_kueue: {message}", file=sys.stderr, flush=True)


# -- the scenario ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Arrival:
    at_s: float
    cohort: int
    team: int
    klass: str
    index: int
    gpus: int  # per replica
    replicas: int
    duration_s: float
    priority: int

    @property
    def name(self) -> str:
        """As bench.kueue_e2e names its jobs: the class first."""
        return f"{self.klass}-{self.cohort}-{self.team}-{self.index}"

    @property
    def queue(self) -> str:
        return f"cohort-{self.cohort}-team-{self.team}"

    @property
    def total_gpus(self) -> int:
        return self.gpus * self.replicas


def scaled(count: int, fraction: float) -> int:
    return max(1, round(count * fraction))


def plan(fraction: float) -> list[Arrival]:
    """Every queue's workloads, `fraction` of each class, at the scenario's intervals."""
    if not 0 < fraction <= 1:
        raise ValueError("fraction must be in (0, 1]")
    out = [
        Arrival(round(i * interval, 6), c, t, name, i, gpus, replicas, duration, priority)
        for c in range(COHORTS)
        for t in range(TEAMS_PER_COHORT)
        for name, (count, gpus, replicas, duration, interval, priority) in CLASSES.items()
        for i in range(scaled(count, fraction))
    ]
    return sorted(out, key=lambda a: (a.at_s, a.name))


@dataclass
class Tally:
    """What one scheduler did with the arrivals, on one monotonic clock."""

    start: float
    created: dict[str, float]
    admitted: dict[str, float]  # first admission
    finished: dict[str, float]
    gpu_s: float
    # The first pod of each started, on the same clock (the simulated kubelets' record): empty
    # for a half whose pods are not a Job's.
    running: dict[str, float] = field(default_factory=dict)

    def figures(self, arrivals: list[Arrival]) -> dict[str, Any]:
        by_name = {a.name: a for a in arrivals}

        def means(marks: dict[str, float]) -> dict[str, float | None]:
            """Each class's mean from creation to `marks` (by name), s."""
            waits: dict[str, list[float]] = {name: [] for name in CLASSES}
            for name, at in marks.items():
                if name in self.created and name in by_name:
                    waits[by_name[name].klass].append(at - self.created[name])
            return {c: round(sum(w) / len(w), 3) if w else None for c, w in waits.items()}

        wall = max(self.finished.values(), default=self.start) - self.start
        capacity = NODES * GPUS_PER_NODE
        return {
            "wall_s": round(wall, 2),
            "admission_mean_s": means(self.admitted),
            # creation to the first pod running (the simulated kubelet started it): the mark
            # that means the same for both halves, where admission does not (Kueue admits by
            # quota, its pods then wait for kube-scheduler; Gantry admits placed)
            "running_mean_s": means(self.running),
            "usage_pct": round(100 * self.gpu_s / (capacity * wall), 1) if wall > 0 else 0.0,
            "workloads": len(arrivals),
            "admitted": len(self.admitted),
            "finished": len(self.finished),
        }


# -- the plane -----------------------------------------------------------------------------------


@contextlib.contextmanager
def own_plane(folder: Path) -> Iterator[ControlPlane]:
    """A fresh control plane in `folder`, stopped afterwards. Its controller manager runs
    without the node lifecycle controller, as bench/k8s_peers.py's does: a lease renewal late
    under load would otherwise taint a node NotReady mid-measurement."""
    plane = ControlPlane(folder)
    plane.stop()
    shutil.rmtree(folder / "etcd", ignore_errors=True)
    plane.start(controller_manager=True, controllers="*,-nodelifecycle")
    try:
        yield plane
    finally:
        plane.stop()


def _json(response: Any) -> Any:
    """The body of a raw answer, read before its connection goes back to the pool (one given
    back unread hands its leftover bytes to the next request)."""
    try:
        return json.loads(response.data) if response.data else None
    finally:
        response.release_conn()


def _create(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> None:
    """Create, accepting that it exists (a rerun on the same plane)."""
    from kubernetes.client.rest import ApiException

    try:
        _json(fn(*args, _preload_content=False, **kwargs))
    except ApiException as error:
        if error.status != 409:
            raise


def pod_duration(pod: dict[str, Any]) -> float | None:
    """The pod's run time, from the environment its job's spec gave it."""
    for container in pod["spec"].get("containers") or ():
        for var in container.get("env") or ():
            if var.get("name") == DURATION_ENV:
                return float(var["value"])
    return None


def node_names() -> list[str]:
    return [f"node-{i:02d}" for i in range(NODES)]


# -- Kueue -------------------------------------------------------------------------------------


def kueue_module_dir() -> Path | None:
    """Kueue's module in the Go module cache (its CRDs ship in the module zip)."""
    go = shutil.which("go")
    if go is None:
        return None
    try:
        cache = subprocess.run(  # noqa: S603 - the Go toolchain, asked where its cache is
            [go, "env", "GOMODCACHE"], capture_output=True, text=True, check=True
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return None
    found = Path(cache) / "sigs.k8s.io" / f"kueue@{versions.KUEUE}"
    return found if found.is_dir() else None


def crds(module: Path, webhook_port: int, ca_bundle: str | None = None) -> list[dict[str, Any]]:
    """Kueue's CRDs, the converted ones pointing at Kueue's webhook server on loopback (whose
    certificate `ca_bundle`, base64 PEM, signs)."""
    out = []
    for path in sorted((module / "config/components/crd/bases").glob("*.yaml")):
        doc = yaml.safe_load(path.read_text())
        plural = doc["spec"]["names"]["plural"]
        if plural in CONVERTED:
            doc["spec"]["conversion"] = {
                "strategy": "Webhook",
                "webhook": {
                    "clientConfig": {"url": f"https://127.0.0.1:{webhook_port}/convert"},
                    "conversionReviewVersions": ["v1"],
                },
            }
            if ca_bundle:
                doc["spec"]["conversion"]["webhook"]["clientConfig"]["caBundle"] = ca_bundle
        out.append(doc)
    return out


def kueue_config(folder: Path, webhook_port: int, health_port: int) -> dict[str, Any]:
    """Kueue's shipped manager configuration (config/components/manager), on loopback ports,
    without leader election, metrics or integrations beyond batch/job."""
    return {
        "apiVersion": "config.kueue.x-k8s.io/v1beta2",
        "kind": "Configuration",
        "namespace": KUEUE_NAMESPACE,
        "health": {"healthProbeBindAddress": f"127.0.0.1:{health_port}"},
        "metrics": {"bindAddress": "0"},
        "webhook": {"port": webhook_port, "host": "127.0.0.1", "certDir": str(folder / "certs")},
        "leaderElection": {"leaderElect": False},
        # Its webhook serves the plane's own serving certificate (kueue_process), valid for
        # 127.0.0.1: the certificate its manager would make names its Service, and the API
        # server, calling the conversion webhook on loopback, refused every conversion
        # ("x509: cannot validate certificate for 127.0.0.1"), retried dozens of times a second.
        "internalCertManagement": {"enable": False},
        "controller": {
            "groupKindConcurrency": {
                "Job.batch": 5,
                "Pod": 5,
                "Workload.kueue.x-k8s.io": 5,
                "LocalQueue.kueue.x-k8s.io": 1,
                "Cohort.kueue.x-k8s.io": 1,
                "ClusterQueue.kueue.x-k8s.io": 1,
                "ResourceFlavor.kueue.x-k8s.io": 1,
            }
        },
        "clientConnection": {"qps": 50, "burst": 100},
        "integrations": {"frameworks": ["batch/job"]},
    }


def queue_objects(
    nominal: int = 20, admission_checks: tuple[str, ...] = ()
) -> list[tuple[str, dict[str, Any]]]:
    """(plural, object) of the flavor, priority classes, ClusterQueues (`nominal` GPUs each, and
    the AdmissionChecks named) and LocalQueues."""
    api_version = f"{GROUP}/{VERSION}"
    out: list[tuple[str, dict[str, Any]]] = [
        (
            "resourceflavors",
            {"apiVersion": api_version, "kind": "ResourceFlavor", "metadata": {"name": FLAVOR}},
        )
    ]
    for name, spec in CLASSES.items():
        body = {
            "apiVersion": api_version,
            "kind": "WorkloadPriorityClass",
            "metadata": {"name": f"kueue-{name}"},
            "value": spec[5],
        }
        out.append(("workloadpriorityclasses", body))
    for c in range(COHORTS):
        for t in range(TEAMS_PER_COHORT):
            queue = f"cohort-{c}-team-{t}"
            quota = {"name": GPU, "nominalQuota": str(nominal), "borrowingLimit": "100"}
            cq: dict[str, Any] = {
                "apiVersion": api_version,
                "kind": "ClusterQueue",
                "metadata": {"name": queue},
                "spec": {
                    "cohortName": f"cohort-{c}",
                    "namespaceSelector": {},
                    "resourceGroups": [
                        {
                            "coveredResources": [GPU],
                            "flavors": [{"name": FLAVOR, "resources": [quota]}],
                        }
                    ],
                    "preemption": {
                        "reclaimWithinCohort": "Any",
                        "withinClusterQueue": "LowerPriority",
                    },
                },
            }
            if admission_checks:
                cq["spec"]["admissionChecksStrategy"] = {
                    "admissionChecks": [{"name": name} for name in admission_checks]
                }
            lq = {
                "apiVersion": api_version,
                "kind": "LocalQueue",
                "metadata": {"name": queue, "namespace": kueue_namespace(queue)},
                "spec": {"clusterQueue": queue},
            }
            out += [("clusterqueues", cq), ("localqueues", lq)]
    return out


def kueue_namespace(queue: str) -> str:
    return f"kueue-{queue}"


def workload(arrival: Arrival) -> dict[str, Any]:
    """A fully specified Workload, as Kueue's performance runner creates them."""
    container = {
        "name": "main",
        "image": "bench/job:1",
        "resources": {"requests": {GPU: str(arrival.gpus)}},
    }
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "Workload",
        "metadata": {"name": arrival.name, "namespace": kueue_namespace(arrival.queue)},
        "spec": {
            "queueName": arrival.queue,
            "priorityClassRef": {
                "group": GROUP,
                "kind": "WorkloadPriorityClass",
                "name": f"kueue-{arrival.klass}",
            },
            "priority": arrival.priority,
            "podSets": [
                {
                    "name": "main",
                    "count": arrival.replicas,
                    "template": {"spec": {"containers": [container], "restartPolicy": "Never"}},
                }
            ],
        },
    }


def batch_job(
    arrival: Arrival, namespace: str, *, labels: dict[str, str],
    annotations: dict[str, str] | None = None, scheduler_name: str | None = None,
) -> dict[str, Any]:  # fmt: skip
    """The batch/v1 Job a user creates for `arrival`, suspended (as a queueing webhook leaves
    it): one shape for Kueue's and Gantry's Kubernetes-native halves, each adding its labels,
    annotations and scheduler."""
    container = {
        "name": "main",
        "image": "bench/job:1",
        # A project namespace enforces Pod Security `restricted`: its Jobs' pods comply.
        "securityContext": {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}},
        "env": [{"name": DURATION_ENV, "value": str(arrival.duration_s)}],
        "resources": {
            "requests": {GPU: str(arrival.gpus), "cpu": "1", "memory": "1Gi"},
            "limits": {GPU: str(arrival.gpus)},
        },
    }
    pod_spec: dict[str, Any] = {
        "restartPolicy": "Never",
        "securityContext": {
            "runAsNonRoot": True,
            "runAsUser": 1000,
            "seccompProfile": {"type": "RuntimeDefault"},
        },
        "containers": [container],
    }
    if scheduler_name:
        pod_spec["schedulerName"] = scheduler_name
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {
            "name": arrival.name,
            "namespace": namespace,
            "labels": labels,
            "annotations": annotations or {},
        },
        "spec": {
            "suspend": True,
            "parallelism": arrival.replicas,
            "completions": arrival.replicas,
            "completionMode": "Indexed",
            "backoffLimit": 0,
            "template": {"spec": pod_spec},
        },
    }


def kueue_job(arrival: Arrival) -> dict[str, Any]:
    """The same Job as Kueue's webhook leaves it: suspended, in its LocalQueue with its
    WorkloadPriorityClass; kube-scheduler places its pods."""
    labels = {
        "kueue.x-k8s.io/queue-name": arrival.queue,
        "kueue.x-k8s.io/priority-class": f"kueue-{arrival.klass}",
    }
    return batch_job(arrival, kueue_namespace(arrival.queue), labels=labels)


def _condition(obj: dict[str, Any], kind: str) -> dict[str, Any] | None:
    for condition in (obj.get("status") or {}).get("conditions") or ():
        if condition.get("type") == kind:
            return dict(condition)
    return None


def _true(obj: dict[str, Any], kind: str) -> bool:
    condition = _condition(obj, kind)
    return condition is not None and condition.get("status") == "True"


def _stamp() -> str:
    import datetime as dt

    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def finished_status(obj: dict[str, Any]) -> dict[str, Any]:
    """The apply body that ends an admitted Workload (what the runner's finish writes)."""
    meta = obj["metadata"]
    condition = {
        "type": "Finished",
        "status": "True",
        "reason": "ByTest",
        "message": "finished by bench.k8s_kueue after its duration",
        "observedGeneration": meta.get("generation", 1),
        "lastTransitionTime": _stamp(),
    }
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "Workload",
        "metadata": {"name": meta["name"], "namespace": meta["namespace"]},
        "status": {"conditions": [condition]},
    }


def requeued_status(obj: dict[str, Any]) -> dict[str, Any]:
    """The apply body, as Kueue's admission manager, that releases an evicted Workload's quota
    (no admission, QuotaReserved and Admitted false) so that it queues again: what a job
    controller does on eviction, and the performance runner in its absence."""
    meta = obj["metadata"]
    now = _stamp()
    generation = meta.get("generation", 1)
    conditions = []
    for kind in ADMISSION_CONDITIONS:
        condition = _condition(obj, kind)
        if condition is None:
            continue
        if kind in ("QuotaReserved", "Admitted") and condition.get("status") != "False":
            condition |= {
                "status": "False",
                "reason": "Pending" if kind == "QuotaReserved" else "NoReservation",
                "message": "Evicted; requeued by bench.k8s_kueue",
                "lastTransitionTime": now,
                "observedGeneration": generation,
            }
        conditions.append(condition)
    status: dict[str, Any] = {"conditions": conditions}
    for key in ("requeueState", "schedulingStats", "accumulatedPastExecutionTimeSeconds"):
        if key in (obj.get("status") or {}):
            status[key] = obj["status"][key]
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "Workload",
        "metadata": {"name": meta["name"], "namespace": meta["namespace"]},
        "status": status,
    }


class KueueDriver:
    """Creates the Workloads at their arrival times, watches Kueue admit them, finishes each
    after its duration and requeues the evicted; tallies on the monotonic clock."""

    def __init__(
        self, api: Any, arrivals: list[Arrival], *, creators: int = CREATORS, finishers: int = 4
    ) -> None:
        from kubernetes import client

        self.api = api
        self.custom: Any = client.CustomObjectsApi(api)
        self.arrivals = arrivals
        self.by_name = {a.name: a for a in arrivals}
        self.creators, self.finishers = creators, finishers
        self.lock = threading.Lock()
        self.stop = threading.Event()
        self.created: dict[str, float] = {}
        self.admitted: dict[str, float] = {}
        self.finished: dict[str, float] = {}
        self.holding: dict[str, float] = {}  # admitted now, since
        self.gpu_s = 0.0
        self.evictions = 0
        self.errors: list[str] = []
        self.due: list[tuple[float, str]] = []  # (finish at, name) of the admitted
        self.wake = threading.Condition(self.lock)
        # Without a job controller the driver plays its part: it ends each Workload after its
        # duration (`finishers` threads) and requeues the evicted. A subclass whose Workloads
        # a job controller owns turns both off (finishers=0, requeues False).
        self.requeues = True

    # the watch ---------------------------------------------------------------------------------

    def _watch(self) -> None:
        resource_version = ""
        while not self.stop.is_set():
            try:
                if not resource_version:
                    listing = _json(
                        self.custom.list_cluster_custom_object(
                            GROUP, VERSION, "workloads", _preload_content=False
                        )
                    )
                    for obj in listing["items"]:
                        self._seen(obj)
                    resource_version = listing["metadata"]["resourceVersion"]
                response = self.custom.list_cluster_custom_object(
                    GROUP,
                    VERSION,
                    "workloads",
                    watch=True,
                    resource_version=resource_version,
                    allow_watch_bookmarks=True,
                    timeout_seconds=60,
                    _preload_content=False,
                    _request_timeout=(10, 90),
                )
                resource_version = self._read(response, resource_version)
            except Exception as error:  # the watch reopens; the tally says why
                self.errors.append(f"watch: {error}")
                resource_version = ""
                self.stop.wait(0.5)

    def _read(self, response: Any, resource_version: str) -> str:
        buffer = b""
        try:
            for chunk in response.stream(65536):
                buffer += chunk
                *lines, buffer = buffer.split(b"\n")
                for line in lines:
                    if not line.strip():
                        continue
                    event = json.loads(line)
                    obj = event["object"]
                    if event["type"] == "ERROR":
                        return ""  # 410 Gone: list again
                    resource_version = obj["metadata"]["resourceVersion"]
                    if event["type"] in ("ADDED", "MODIFIED"):
                        self._seen(obj)
                if self.stop.is_set():
                    break
        finally:
            response.release_conn()
        return resource_version

    def _seen(self, obj: dict[str, Any]) -> None:
        name = self.arrival_name(obj)
        arrival = self.by_name.get(name)
        if arrival is None:
            return
        now = time.monotonic()
        admitted = _true(obj, "Admitted")
        with self.lock:
            if name in self.finished:
                return
            if _true(obj, "Finished"):
                self.finished[name] = now
                self._release(name, now)
                self.wake.notify()
                return
            if admitted and name not in self.holding:
                self.holding[name] = now
                self.admitted.setdefault(name, now)
                heapq.heappush(self.due, (now + arrival.duration_s, name))
                self.wake.notify()
            elif not admitted and name in self.holding:
                self._release(name, now)
        if self.requeues and _true(obj, "Evicted") and _true(obj, "QuotaReserved"):
            self._requeue(obj)

    def arrival_name(self, obj: dict[str, Any]) -> str:
        """The arrival a Workload stands for: here its own name (created by `submit`)."""
        return str(obj["metadata"]["name"])

    def submit(self, arrival: Arrival) -> None:
        """Create what the arrival's user creates: here its Workload, fully specified."""
        body = workload(arrival)
        _json(
            self.custom.create_namespaced_custom_object(
                GROUP, VERSION, body["metadata"]["namespace"], "workloads", body,
                _preload_content=False,
            )
        )  # fmt: skip

    def _release(self, name: str, now: float) -> None:
        since = self.holding.pop(name, None)
        if since is not None:
            self.gpu_s += (now - since) * self.by_name[name].total_gpus

    # finishing and requeueing ----------------------------------------------------------------

    def _apply_status(self, obj: dict[str, Any], body: dict[str, Any], manager: str) -> None:
        meta = obj["metadata"]
        _json(
            self.custom.patch_namespaced_custom_object_status(
                GROUP,
                VERSION,
                meta["namespace"],
                "workloads",
                meta["name"],
                body,
                field_manager=manager,
                force=True,
                _content_type="application/apply-patch+yaml",
                _preload_content=False,
            )
        )

    def _requeue(self, obj: dict[str, Any]) -> None:
        from kubernetes.client.rest import ApiException

        with self.lock:
            self.evictions += 1
        try:
            self._apply_status(obj, requeued_status(obj), ADMISSION_MANAGER)
        except ApiException as error:
            if error.status != 404:
                self.errors.append(f"requeue {obj['metadata']['name']}: {error.status}")

    def _finisher(self) -> None:
        from kubernetes.client.rest import ApiException

        while not self.stop.is_set():
            with self.lock:
                while not self.stop.is_set() and (
                    not self.due or self.due[0][0] > time.monotonic()
                ):
                    wait = self.due[0][0] - time.monotonic() if self.due else 0.5
                    self.wake.wait(max(0.001, min(wait, 0.5)))
                if self.stop.is_set():
                    return
                _, name = heapq.heappop(self.due)
                if name not in self.holding:
                    continue  # evicted meanwhile: it runs again when readmitted
            arrival = self.by_name[name]
            obj = {
                "metadata": {"name": name, "namespace": kueue_namespace(arrival.queue)},
            }
            try:
                self._apply_status(obj, finished_status(obj), FINISHED_MANAGER)
            except ApiException as error:
                if error.status != 404:
                    self.errors.append(f"finish {name}: {error.status}")

    # creating ------------------------------------------------------------------------------

    def _creator(self, mine: list[Arrival], start: float) -> None:
        for arrival in mine:
            delay = start + arrival.at_s - time.monotonic()
            if delay > 0 and self.stop.wait(delay):
                return
            with self.lock:
                self.created[arrival.name] = time.monotonic()
            try:
                self.submit(arrival)
            except Exception as error:  # counted, and the run goes on
                self.errors.append(f"create {arrival.name}: {error}")

    def run(self, limit_s: float) -> Tally:
        threads = [threading.Thread(target=self._watch, daemon=True, name="kueue-watch")]
        threads += [
            threading.Thread(target=self._finisher, daemon=True, name=f"kueue-finish-{i}")
            for i in range(self.finishers)
        ]
        for thread in threads:
            thread.start()
        start = time.monotonic() + 1.0  # the watch is open before the first arrival
        shares = [self.arrivals[i :: self.creators] for i in range(self.creators)]
        creators = [
            threading.Thread(target=self._creator, args=(share, start), daemon=True)
            for share in shares
        ]
        for thread in creators:
            thread.start()
        while time.monotonic() - start < limit_s:
            with self.lock:
                if len(self.finished) == len(self.arrivals):
                    break
            time.sleep(0.2)
        self.stop.set()
        with self.wake:
            self.wake.notify_all()
        for thread in [*creators, *threads]:
            thread.join(timeout=5)
        with self.lock:
            for name in list(self.holding):
                self._release(name, time.monotonic())
            return Tally(start, dict(self.created), dict(self.admitted), dict(self.finished),
                         self.gpu_s)  # fmt: skip


def _apply_crds(
    api: Any, module: Path, webhook_port: int, ca_bundle: str, timeout_s: float = 60.0
) -> None:
    from kubernetes import client

    extensions: Any = client.ApiextensionsV1Api(api)
    documents = crds(module, webhook_port, ca_bundle)
    for doc in documents:
        _create(extensions.create_custom_resource_definition, doc)
    deadline = time.monotonic() + timeout_s
    for doc in documents:
        name = doc["metadata"]["name"]
        while True:
            found = _json(extensions.read_custom_resource_definition(name, _preload_content=False))
            if any(
                c["type"] == "Established" and c["status"] == "True"
                for c in (found.get("status") or {}).get("conditions") or ()
            ):
                break
            if time.monotonic() > deadline:
                raise RuntimeError(f"CRD {name} not established within {timeout_s} s")
            time.sleep(0.2)


def serving_certs(plane: ControlPlane, folder: Path) -> str:
    """Kueue's webhook certificate: the plane's serving one (for 127.0.0.1, signed by the
    plane's CA) in its `certDir`; a metrics certificate where Kueue requires one
    (METRICS_CERT_DIR), written once and shared by every Kueue on the host. Returns the CA
    the CRDs' conversion webhook trusts, base64."""
    import base64

    cert, key = plane.pki.serving
    (folder / "certs").mkdir(parents=True, exist_ok=True)
    shutil.copyfile(cert, folder / "certs" / "tls.crt")
    shutil.copyfile(key, folder / "certs" / "tls.key")
    try:
        METRICS_CERT_DIR.mkdir(parents=True, exist_ok=True)
        for source, name in ((cert, "tls.crt"), (key, "tls.key")):
            if not (METRICS_CERT_DIR / name).exists():  # another Kueue may be reading it
                temporary = METRICS_CERT_DIR / f".{name}.{os.getpid()}"
                shutil.copyfile(source, temporary)
                os.replace(temporary, METRICS_CERT_DIR / name)
    except OSError as error:
        raise RuntimeError(
            f"Kueue {versions.KUEUE} without its certificate manager reads a metrics "
            f"certificate at {METRICS_CERT_DIR}, which cannot be written here: {error}"
        ) from error
    return base64.b64encode(plane.pki.ca.read_bytes()).decode()


def _wait_ready(process: subprocess.Popen[bytes], port: int, log: Path) -> None:
    deadline = time.monotonic() + READY_TIMEOUT_S
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(
                f"kueue exited ({process.returncode}) before it was ready: "
                + log.read_text(errors="replace")[-2000:]
            )
        url = f"http://127.0.0.1:{port}/readyz"
        with contextlib.suppress(OSError), urllib.request.urlopen(url, timeout=2) as r:
            if r.status == 200:
                return
        time.sleep(0.5)
    raise RuntimeError(
        f"kueue not ready within {READY_TIMEOUT_S} s: " + log.read_text(errors="replace")[-2000:]
    )


def _wait_queues_active(api: Any, timeout_s: float = 60.0) -> None:
    from kubernetes import client

    custom: Any = client.CustomObjectsApi(api)
    deadline = time.monotonic() + timeout_s
    while True:
        items = _json(
            custom.list_cluster_custom_object(
                GROUP, VERSION, "clusterqueues", _preload_content=False
            )
        )["items"]
        if len(items) == COHORTS * TEAMS_PER_COHORT and all(_true(cq, "Active") for cq in items):
            return
        if time.monotonic() > deadline:
            raise RuntimeError(f"ClusterQueues not active within {timeout_s} s")
        time.sleep(0.5)


def kueue_missing() -> str | None:
    """Why Kueue cannot run here (not built, its module not downloaded), or None."""
    binary = versions.binary("kueue")
    if not (binary.is_file() and versions.binary("versionproxy").is_file()):
        return (
            f"Kueue {versions.KUEUE} is not built ({binary} is missing): "
            "python -m devcluster build --peers, or make control-plane-peers"
        )
    if kueue_module_dir() is None:
        return (
            f"sigs.k8s.io/kueue@{versions.KUEUE} is not in the Go module cache, where "
            "its CRDs are read: python -m devcluster build --peers downloads it"
        )
    return None


@contextlib.contextmanager
def kueue_process(
    plane: ControlPlane, api: Any, folder: Path, say: Say, *,
    configure: Callable[[dict[str, Any]], None] = lambda _config: None,
) -> Iterator[None]:  # fmt: skip
    """Kueue's manager on `plane`, ready: its CRDs applied (their conversion webhook trusting
    its certificate, `serving_certs`), its namespace, the version proxy in front of the API
    server; stopped afterwards. `configure` may change
    its configuration (kueue_config) before it starts. Assumes `kueue_missing()` is None."""
    from kubernetes import client

    module = kueue_module_dir()
    assert module is not None, kueue_missing()
    folder.mkdir(parents=True, exist_ok=True)
    webhook_port, health_port = free_port(), free_port()
    _apply_crds(api, module, webhook_port, serving_certs(plane, folder))
    core: Any = client.CoreV1Api(api)
    _create(core.create_namespace, {"metadata": {"name": KUEUE_NAMESPACE}})
    proxy_port = free_port()
    kubeconfig = folder / "kubeconfig"
    kubeconfig.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [
                    {"name": "plane", "cluster": {"server": f"http://127.0.0.1:{proxy_port}"}}
                ],
                "users": [{"name": "kueue", "user": {}}],
                "contexts": [{"name": "kueue", "context": {"cluster": "plane", "user": "kueue"}}],
                "current-context": "kueue",
            }
        )
    )
    cert, key = plane.pki.client("admin")
    proxy_command = [
        str(versions.binary("versionproxy")),
        f"--listen=127.0.0.1:{proxy_port}",
        f"--upstream={plane.url}",
        f"--ca={plane.pki.ca}",
        f"--cert={cert}",
        f"--key={key}",
        f"--git-version={versions.KUBERNETES}",
    ]
    config = kueue_config(folder, webhook_port, health_port)
    configure(config)
    (folder / "kueue-config.yaml").write_text(yaml.safe_dump(config))
    log = folder / "kueue.log"
    command = [
        str(versions.binary("kueue")),
        f"--config={folder / 'kueue-config.yaml'}",
        "--feature-gates=VisibilityOnDemand=false",  # its API service needs an aggregator
        "--zap-log-level=error",
    ]
    env = {**os.environ, "KUBECONFIG": str(kubeconfig)}
    say(f"starting Kueue {versions.KUEUE} (log: {log})")
    with open(folder / "versionproxy.log", "wb") as out:
        proxy = subprocess.Popen(  # noqa: S603 - the binary devcluster built
            proxy_command, stdout=out, stderr=subprocess.STDOUT
        )
    with open(log, "wb") as out:
        process = subprocess.Popen(  # noqa: S603 - the binary devcluster built
            command, env=env, stdout=out, stderr=subprocess.STDOUT
        )
    try:
        _wait_ready(process, health_port, log)
        yield
        if process.poll() is not None:
            raise RuntimeError(f"kueue exited ({process.returncode}) during the run")
    finally:
        for child in (process, proxy):
            stop_child(child, 15)


def create_queues(api: Any, arrivals: list[Arrival], objects: list[tuple[str, Any]]) -> None:
    """The arrivals' namespaces, then `objects` (queue_objects), cluster-scoped or not."""
    from kubernetes import client

    core: Any = client.CoreV1Api(api)
    custom: Any = client.CustomObjectsApi(api)
    for queue in sorted({a.queue for a in arrivals}):
        _create(core.create_namespace, {"metadata": {"name": kueue_namespace(queue)}})
    for plural, body in objects:
        namespace = body["metadata"].get("namespace")
        if namespace:
            _create(custom.create_namespaced_custom_object, GROUP, VERSION, namespace,
                    plural, body)  # fmt: skip
        else:
            _create(custom.create_cluster_custom_object, GROUP, VERSION, plural, body)


def run_kueue(
    plane: ControlPlane, api: Any, arrivals: list[Arrival], folder: Path, limit_s: float, say: Say
) -> dict[str, Any]:
    """Kueue's half: its figures, or `error` saying what failed."""
    missing = kueue_missing()
    if missing:
        return {"error": missing}
    with kueue_process(plane, api, folder, say):
        create_queues(api, arrivals, queue_objects())
        _wait_queues_active(api)
        say(f"Kueue: {len(arrivals)} workloads")
        driver = KueueDriver(api, arrivals)
        tally = driver.run(limit_s)
    return tally.figures(arrivals) | {
        "evictions": driver.evictions,
        "driver_errors": driver.errors[:20],
        "version": versions.KUEUE,
    }


class KueueJobsDriver(KueueDriver):
    """Creates each arrival's batch/v1 Job and watches the Workloads Kueue's job integration
    makes for them (named by Kueue, owned by the Job). The plane's job controller makes the
    pods, kube-scheduler binds them, the simulated kubelets end them, and Kueue finishes and
    requeues the Workloads itself: no finisher, no requeue here."""

    def __init__(self, api: Any, arrivals: list[Arrival]) -> None:
        from kubernetes import client

        super().__init__(api, arrivals, finishers=0)
        self.requeues = False
        self.batch: Any = client.BatchV1Api(api)

    def arrival_name(self, obj: dict[str, Any]) -> str:
        owners = obj["metadata"].get("ownerReferences") or ()
        return next((o["name"] for o in owners if o.get("kind") == "Job"), "")

    def job(self, arrival: Arrival) -> dict[str, Any]:
        return kueue_job(arrival)

    def submit(self, arrival: Arrival) -> None:
        body = self.job(arrival)
        _json(
            self.batch.create_namespaced_job(
                body["metadata"]["namespace"], body, _preload_content=False
            )
        )


def clear_jobs(api: Any, namespaces: list[str], timeout_s: float = 300.0) -> float | None:
    """Delete the Jobs and pods of `namespaces` and wait until none is left: a half leaves
    its 1,500 finished Jobs and pods (and Kueue's Workloads) on the plane, which the next
    half's job controller and simulated kubelets (a list of every bound pod, 20 a second)
    would otherwise carry. Seconds taken, or None when some were left after `timeout_s`."""
    from kubernetes import client

    batch: Any = client.BatchV1Api(api)
    core: Any = client.CoreV1Api(api)
    started = time.monotonic()
    for namespace in namespaces:
        batch.delete_collection_namespaced_job(namespace, propagation_policy="Background")
        core.delete_collection_namespaced_pod(namespace, grace_period_seconds=0)
    while time.monotonic() - started < timeout_s:
        left = any(  # a page of one says whether any is left
            _json(list_(namespace, limit=1, _preload_content=False))["items"]
            for namespace in namespaces
            for list_ in (batch.list_namespaced_job, core.list_namespaced_pod)
        )
        if not left:
            return round(time.monotonic() - started, 1)
        time.sleep(1.0)
    return None


def _jobs_config(config: dict[str, Any]) -> None:
    """Kueue queues the GPUs alone, as its ClusterQueues cover them: the Jobs' pods also ask
    for CPU and memory, which it would otherwise refuse as resources no queue covers."""
    config["resources"] = {"excludeResourcePrefixes": ["cpu", "memory"]}


@contextlib.contextmanager
def kubelets_apart(kubelets: Kubelets, interval_s: float = 0.05) -> Iterator[dict[str, float]]:
    """The simulated kubelets in a process of their own (`bench.daemon_setup.apart`): neither
    half's scheduler shares an interpreter lock with them. Yields the dict that receives their
    `first_running` record once they stop. Their leases are renewed here (`_heartbeats`)."""
    record: dict[str, float] = {}
    with apart(functools.partial(_play_kubelets, kubelets, interval_s)) as results:
        yield record
    for result in results:
        record.update(result or {})


def _play_kubelets(kubelets: Kubelets, interval_s: float, stop: Any) -> dict[str, float]:
    kubelets.reconnect()
    kubelets.first_running.clear()
    kubelets.run(stop, interval_s, float("inf"))
    return dict(kubelets.first_running)


def run_kueue_jobs(
    plane: ControlPlane, api: Any, kubelets: Kubelets, arrivals: list[Arrival], folder: Path,
    limit_s: float, say: Say,
) -> dict[str, Any]:  # fmt: skip
    """Kueue's half from batch/v1 Jobs (`kueue_job`, the shape Gantry's native half creates):
    Kueue admits and unsuspends, the job controller makes the pods, kube-scheduler binds them.
    Its figures, or `error` saying what failed."""
    missing = kueue_missing()
    if missing:
        return {"error": missing}
    with kueue_process(plane, api, folder, say, configure=_jobs_config):
        create_queues(api, arrivals, queue_objects())
        _wait_queues_active(api)
        plane.start_scheduler()
        try:
            say(f"Kueue with kube-scheduler: {len(arrivals)} Jobs")
            driver = KueueJobsDriver(api, arrivals)
            with kubelets_apart(kubelets) as first_running:
                tally = driver.run(limit_s)
            # the kubelets' wall times on the driver's monotonic clock
            offset = time.monotonic() - time.time()
            tally.running = {n: at + offset for n, at in first_running.items()}
            # Gantry's half then starts on a plane as bare as this one did (Kueue still runs:
            # it lifts its Workloads' finalizers as their Jobs go): the kubelets end the pods
            # Kueue's driver left running meanwhile.
            with kubelets_apart(kubelets):
                cleared = clear_jobs(api, sorted({kueue_namespace(a.queue) for a in arrivals}))
        finally:
            # Its informers would otherwise watch Gantry's pods too, on the same two cores.
            plane.stop_process("kube-scheduler")
    return tally.figures(arrivals) | {
        "evictions": driver.evictions,
        "cleared_s": cleared,
        "driver_errors": driver.errors[:20],
        "version": versions.KUEUE,
        "admission_from": "the Job's creation to its Workload's Admitted condition",
    }


# -- Gantry ------------------------------------------------------------------------------------


def _submitter(arrivals: list[Arrival], start_wall: float, tick: float, rows: Any) -> None:
    """The submitting process: inserts each job at its arrival time (`created_at` records it)."""
    from django.db import connection
    from django.utils import timezone

    from bench.daemon_setup import forget_inherited_connections
    from scheduler.models import Job

    forget_inherited_connections()
    position = 0
    while position < len(arrivals):
        elapsed = time.time() - start_wall
        due = []
        while position < len(arrivals) and arrivals[position].at_s <= elapsed:
            due.append(arrivals[position])
            position += 1
        if due:
            Job.objects.bulk_create(rows(due, timezone.now()), batch_size=2000)
        time.sleep(max(0.0, tick - (time.time() - start_wall - elapsed)))
    connection.close()


def _gantry_world(api: Any) -> World:
    """The scenario's organisation and classes (bench/kueue_e2e.py) with their PriorityClasses
    in the plane, and the Kubernetes backend at kube-scheduler's rate on this plane."""
    from bench.kueue_e2e import setup

    org, classes = setup()
    return org, classes, gantry_backend(api, classes)


def gantry_backend(api: Any, classes: dict[str, Any]) -> Any:
    """The Kubernetes backend at kube-scheduler's rate on the plane of `api`, the classes'
    PriorityClasses made there."""
    from kubernetes import client

    from scheduler.backends.kubernetes.backend import KubernetesBackend
    from scheduler.backends.kubernetes.config import KubernetesConfig

    scheduling: Any = client.SchedulingV1Api(api)
    for klass in classes.values():
        body = {
            "metadata": {"name": f"gantry-{klass.name}"},
            "value": klass.value,
            "preemptionPolicy": "Never",  # only Gantry preempts
        }
        _create(scheduling.create_priority_class, body)
    config = KubernetesConfig(
        flavor_overrides={PRODUCT: FLAVOR}, api_qps=SCHEDULER_QPS, api_burst=SCHEDULER_BURST
    )
    return KubernetesBackend(api, config)


@dataclass
class Cycles:
    """The daemon's cycles as a half runs them: how many, and each phase's seconds summed;
    `done()` says when the half has nothing left (checked every tenth cycle)."""

    limit_s: float
    done: Callable[[], bool]
    start: float = 0.0
    count: int = 0
    phases: dict[str, float] = field(default_factory=dict)

    def daemon(self, backend: Any, interval_s: float) -> Any:
        from bench.bench_profile import bench_profile
        from scheduler.daemon.loop import Daemon
        from scheduler.leader import Lease

        daemon = Daemon(backend, lease=Lease(ttl_s=60),
                        profile=bench_profile("no-min-runtime").profile, interval_s=interval_s,
                        max_pending=500, per_queue=50, sync_every_s=1.0,
                        on_cycle=self.on_cycle, watch_held=True)  # fmt: skip
        daemon.lease.acquire()
        daemon.sync_nodes(force=True)
        return daemon

    def on_cycle(self, d: Any) -> None:
        self.count += 1
        for name, ms in (d.last.phases_ms if d.last else {}).items():
            self.phases[name] = self.phases.get(name, 0.0) + ms / 1000
        over = time.time() - self.start >= self.limit_s
        if over or (self.count % 10 == 0 and self.done()):
            d.stop.set()

    def top(self) -> dict[str, float]:
        """Where the daemon's time went: the busiest phases, seconds summed over the cycles."""
        busiest = sorted(self.phases.items(), key=lambda item: -item[1])[:6]
        return {name: round(seconds, 1) for name, seconds in busiest}


def _figures(
    arrivals: list[Arrival],
    created: dict[str, float],
    start: float,
    running: dict[str, float] | None = None,
) -> dict[str, Any]:
    """A Gantry half's figures from its database: first admissions (the jobs' events), ends,
    allocated GPU-time, preemptions, against each job's creation (`created`, by name); the
    first pod of each running (`running`, the simulated kubelets' record), when given."""
    from scheduler.models import Allocation, Job, JobEvent

    by_name = {a.name: a for a in arrivals}
    jobs = dict(Job.objects.values_list("id", "name"))
    admitted: dict[str, float] = {}
    for job_id, at in (
        JobEvent.objects.filter(to_state="admitted").order_by("at").values_list("job_id", "at")
    ):
        admitted.setdefault(jobs[job_id], at.timestamp())
    finished_at = {
        name: at.timestamp()
        for name, at in Job.objects.filter(state="succeeded").values_list("name", "finished_at")
        if at is not None
    }
    gpu_s = 0.0
    for began, ended, milli in Allocation.objects.filter(ended_at__isnull=False).values_list(
        "started_at", "ended_at", "gpu_milli"
    ):
        gpu_s += ((ended or began) - began).total_seconds() * milli / 1000
    tally = Tally(start, created, admitted, finished_at, gpu_s, running or {})
    figures = tally.figures([by_name[n] for n in jobs.values() if n in by_name and n in created])
    return figures | {
        "queued": len(jobs),
        "preemptions": JobEvent.objects.filter(to_state="preempted").count(),
    }


def run_gantry(
    api: Any, kubelets: Kubelets | list[Kubelets], arrivals: list[Arrival],
    database_url: str | None, limit_s: float, say: Say, *, interval_s: float = 2.0,
    tick_s: float = 0.1, world: Callable[[], World] | None = None,
) -> dict[str, Any]:  # fmt: skip
    """Gantry's half: the daemon with the Kubernetes backend on the plane, on a fresh database
    at `database_url` (dropped and made again), or on Django's database as it is (None).
    `world` makes the organisation, classes and backend once the database is there
    (`_gantry_world` on `api` unless given: bench.multicluster gives a federation), and the
    simulated nodes are `kubelets`' (one simulator per plane)."""
    from bench.daemon_setup import fresh_database, job_rows

    if database_url:
        fresh_database(database_url)
    from django.db import connections

    from scheduler.models import Job

    org, classes, backend = world() if world else _gantry_world(api)
    simulators = kubelets if isinstance(kubelets, list) else [kubelets]

    def rows(due: list[Arrival], now: Any) -> list[Any]:
        specs = [
            {
                "team": org[a.queue],
                "name": a.name,
                "gpus": a.gpus,
                "replicas": a.replicas,
                "duration_s": a.duration_s,
                "priority": classes[a.klass],
            }
            for a in due
        ]
        out = job_rows(specs, now)
        for row, a in zip(out, due, strict=True):
            row.spec["env"] = {DURATION_ENV: str(a.duration_s)}
        return out

    cycles = Cycles(
        limit_s,
        lambda: not process.is_alive() and not Job.objects.exclude(state="succeeded").exists(),
    )
    daemon = cycles.daemon(backend, interval_s)
    stop = threading.Event()
    played = [  # the scenario's own thread renews the leases
        threading.Thread(target=k.run, args=(stop, 0.05, float("inf")), daemon=True)
        for k in simulators
    ]
    for thread in played:
        thread.start()
    connections.close_all()  # the forked submitter opens its own
    say(f"Gantry: {len(arrivals)} jobs")
    cycles.start = start_wall = time.time()
    process = multiprocessing.get_context("fork").Process(
        target=_submitter, args=(arrivals, start_wall, tick_s, rows), daemon=True
    )
    process.start()
    try:
        daemon.run()
    finally:
        process.join(timeout=5)
        stop.set()
        for thread in played:
            thread.join(timeout=10)
    created = {name: at.timestamp() for name, at in Job.objects.values_list("name", "created_at")}
    figures = _figures(arrivals, created, start_wall)
    del figures["queued"]
    return figures | {"workloads": len(arrivals), "cycles": cycles.count, "phases_s": cycles.top()}


# -- Gantry, Kubernetes-native -------------------------------------------------------------------


def native_job(arrival: Arrival, namespace: str, username: str) -> dict[str, Any]:
    """The Job of `arrival` as Gantry's webhook stores it (held: suspended, labelled, its
    creator annotated, Gantry's scheduler on its template). The webhook's own answer is
    measured apart (`python -m bench.webhook`)."""
    from scheduler.workloads.mutate import ANNOTATION_SUBMITTED_BY, LABEL_MANAGED, SCHEDULER_NAME

    labels = {LABEL_MANAGED: "true", "gantry.io/priority-class": f"kueue-{arrival.klass}"}
    return batch_job(arrival, namespace, labels=labels,
                     annotations={ANNOTATION_SUBMITTED_BY: username},
                     scheduler_name=SCHEDULER_NAME)  # fmt: skip


def _job_submitter(
    batch: Any, arrivals: list[Arrival], targets: dict[str, tuple[str, str]], start_wall: float,
    created: dict[str, float], stop: threading.Event,
) -> None:  # fmt: skip
    """Creates each arrival's Job at its time over CREATORS threads, as Kueue's half creates
    its Jobs (`KueueDriver`), each noted as created when its creation is asked, as there: one
    thread creating one Job after the other made a tenth's 1,500 Jobs over three minutes on a
    loaded plane (8 a second), a floor under Gantry's wall time that Kueue's half did not have."""

    def create(mine: list[Arrival]) -> None:
        for arrival in mine:
            wait = start_wall + arrival.at_s - time.time()
            if wait > 0 and stop.wait(wait):
                return
            namespace, username = targets[arrival.queue]
            created[arrival.name] = time.time()
            body = native_job(arrival, namespace, username)
            _create(batch.create_namespaced_job, namespace, body)

    creators = [
        threading.Thread(target=create, args=(arrivals[i::CREATORS],), daemon=True)
        for i in range(CREATORS)
    ]
    for thread in creators:
        thread.start()
    for thread in creators:
        thread.join()


def _controller_loop(controller: Any, stop: threading.Event, every_s: float) -> None:
    from django.db import connection

    try:
        while not stop.is_set():
            try:
                stats = controller.sync()
            except Exception as error:  # a failed pass is tried again, as the process does
                _say(f"workload controller: {type(error).__name__}: {error}")
            else:
                if stats.refused:
                    why = next(iter(controller.refusals.values()), "")
                    _say(f"workload controller: {stats.refused} refused, e.g. {why}")
                if stats.deferred:
                    continue  # its queueing budget spent: the next pass at once, as deployed
            stop.wait(every_s)
    finally:
        controller.close()
        connection.close()


def _database_url() -> str | None:
    """The URL of the PostgreSQL database Django uses now (a test's, or the bench's fresh
    one), for another process; None on SQLite (a test's in-memory database)."""
    from django.db import connection

    settings = connection.settings_dict
    if connection.vendor != "postgresql":
        return None
    password = f":{settings['PASSWORD']}" if settings.get("PASSWORD") else ""
    return (
        f"postgres://{settings['USER']}{password}@{settings['HOST'] or '127.0.0.1'}:"
        f"{settings['PORT'] or 5432}/{settings['NAME']}"
    )


@contextlib.contextmanager
def controller_process(kubeconfig: Path, database_url: str, log: Path) -> Iterator[None]:
    """`manage.py run_workload_controller` as it is deployed (its own process, the held
    objects read from watches, a pass at each change), on `database_url` and the plane of
    `kubeconfig`; stopped (SIGTERM: after its pass) at the end."""
    env = {**os.environ, "DATABASE_URL": database_url, "KUBECONFIG": str(kubeconfig)}
    root = Path(__file__).resolve().parents[1]
    with open(log, "wb") as out:
        process = subprocess.Popen(  # noqa: S603 - this repository's manage.py
            [sys.executable, str(root / "manage.py"), "run_workload_controller"],
            env=env, cwd=root, stdout=out, stderr=subprocess.STDOUT,
        )  # fmt: skip
    try:
        yield
    finally:
        stop_child(process, 30)


def run_gantry_native(
    api: Any, kubelets: Kubelets, arrivals: list[Arrival], database_url: str | None,
    limit_s: float, say: Say, *, interval_s: float = 2.0, controller_every_s: float = 0.5,
    kubeconfig: Path | None = None, log_dir: Path | None = None,
) -> dict[str, Any]:  # fmt: skip
    """Gantry's Kubernetes-native half: each arrival is a batch/v1 Job created in its team's
    namespace; the workload controller queues it as its user, the daemon admits it
    (unsuspends it), the job controller of the plane makes its pods and Gantry binds them.
    Admission is measured from the Job's creation."""
    from bench.daemon_setup import fresh_database

    if database_url:
        fresh_database(database_url)
    from kubernetes import client

    from scheduler.models import FINAL_STATES, Job, JobEvent
    from scheduler.workloads.controller import WorkloadController
    from tenants.models import Membership

    org, _classes, backend = _gantry_world(api)
    targets: dict[str, tuple[str, str]] = {}
    for queue, (tenant, user, project) in org.items():
        # The team's member who creates its Jobs (the DB half inserts rows, needing none).
        Membership.objects.get_or_create(user=user, tenant=tenant, defaults={"role": "member"})
        backend.ensure_namespace(project.namespace)
        targets[queue] = (project.namespace, user.get_username())
    created: dict[str, float] = {}
    cycles = Cycles(
        limit_s,
        lambda: (
            len(created) == len(arrivals)
            and Job.objects.count() == len(arrivals)
            and not Job.objects.exclude(state__in=FINAL_STATES).exists()
        ),
    )
    stop = threading.Event()
    threads = [
        threading.Thread(
            target=_job_submitter,
            args=(client.BatchV1Api(api), arrivals, targets, time.time(), created, stop),
            daemon=True,
        ),
    ]
    # The workload controller as deployed, a process of its own, where it can be (PostgreSQL,
    # the plane's kubeconfig); else a thread of this one listing every `controller_every_s`.
    url = _database_url()
    if url and kubeconfig is not None:
        log = (log_dir or Path(tempfile.mkdtemp(prefix="k8s-kueue-"))) / "controller.log"
        controller: contextlib.AbstractContextManager[None] = controller_process(
            kubeconfig, url, log
        )
        how = f"the workload controller's process (log: {log})"
    else:
        controller = contextlib.nullcontext()
        threads.append(
            threading.Thread(
                target=_controller_loop,
                args=(WorkloadController(backend, background_tells=True), stop, controller_every_s),
                daemon=True,
            )
        )
        how = "the workload controller in a thread"
    say(f"Gantry, Kubernetes-native: {len(arrivals)} Jobs, {how}")
    # The kubelets forked before this process starts the daemon's threads.
    with controller, kubelets_apart(kubelets) as first_running:
        daemon = cycles.daemon(backend, interval_s)
        cycles.start = start_wall = time.time()
        for thread in threads:
            thread.start()
        try:
            daemon.run()
        finally:
            stop.set()
            for thread in threads:
                thread.join(timeout=15)
    figures = _figures(arrivals, dict(created), start_wall, dict(first_running))
    batch: Any = client.BatchV1Api(api)
    stuck = []
    for name, state, namespace in Job.objects.exclude(state="succeeded").values_list(
        "name", "state", "project__namespace"
    )[:3]:  # what the Jobs of jobs that did not finish say, to read why
        found = _json(batch.read_namespaced_job(name, namespace, _preload_content=False))
        status = found.get("status") or {}
        stuck.append({"job": name, "state": state, "suspend": found["spec"].get("suspend"),
                      "active": status.get("active"), "conditions": [
                          c["type"] for c in status.get("conditions") or ()]})  # fmt: skip
    return figures | {
        "not_finished": stuck,
        "ended_as_their_jobs_did": Job.objects.filter(state="cancelled").count(),
        # preempted as their pods finished, their Jobs completed while they waited again
        "succeeded_while_queued": JobEvent.objects.filter(
            to_state="succeeded", from_state__in=("queued", "preempted")
        ).count(),
        "workloads": len(arrivals),
        "created": len(created),
        "cycles": cycles.count,
        "phases_s": cycles.top(),
        "admission_from": "the Job's creation in Kubernetes (the webhook's answer apart)",
        "controller": "process" if url and kubeconfig is not None else "thread",
    }


# -- both ----------------------------------------------------------------------------------------


def run_kueue_scenario(
    plane_factory: PlaneFactory,
    fraction: float,
    *,
    kueue: bool = True,
    native: bool = False,
    from_database: bool = True,
    database_url: str | None = DEFAULT_DATABASE_URL,
    limit_s: float = 900.0,
    work_dir: Path | None = None,
    say: Say = _say,
) -> dict[str, Any]:
    """Kueue's scenario at `fraction`, by Kueue and by Gantry on one plane from `plane_factory`
    (a context manager that yields a started ControlPlane and stops it after). `kueue=False`
    runs Gantry alone, and the Kueue halves say why (`skipped`). `native` adds the halves
    from batch/v1 Jobs created in Kubernetes, the same Jobs for both: Kueue's with
    kube-scheduler (`kueue_jobs`) and Gantry's Kubernetes-native path (`gantry_native`);
    `from_database=False` leaves out the two halves whose arrivals are made as their
    scheduler's own records (Kueue's Workloads, Gantry's rows). Gantry's jobs
    go to a fresh database at `database_url`, or to Django's database as it is when None (a
    test's)."""
    from kubernetes import config as kube_config

    arrivals = plan(fraction)
    out: dict[str, Any] = {
        "fraction": fraction,
        "workloads": len(arrivals),
        "nodes": NODES,
        "gpus": NODES * GPUS_PER_NODE,
        "versions": {"kubernetes": versions.KUBERNETES, "kueue": versions.KUEUE},
    }
    folder = work_dir or Path(tempfile.mkdtemp(prefix="k8s-kueue-"))
    stop = threading.Event()
    beating: threading.Thread | None = None
    with plane_factory() as plane:
        api = kube_config.new_client_from_config(str(plane.kubeconfig))
        try:
            kubelets = Kubelets(api, duration=pod_duration)
            kubelets.add_nodes(node_names(), NodeShape(gpus=GPUS_PER_NODE, product=PRODUCT))
            # Leases renewed throughout, for a borrowed plane whose node lifecycle controller
            # runs: nodes silent past its grace turn Ready=Unknown, and the simulated
            # kubelets never post Ready again.
            beating = threading.Thread(target=_heartbeats, args=(kubelets, stop), daemon=True)
            beating.start()
            if kueue and from_database:
                try:
                    out["kueue"] = run_kueue(plane, api, arrivals, folder / "kueue", limit_s, say)
                except Exception as error:  # the report says what failed
                    out["kueue"] = {"error": f"{type(error).__name__}: {error}"}
            elif from_database:
                out["kueue"] = {"skipped": KUEUE_LEFT_OUT}
            if from_database:
                out["gantry"] = run_gantry(api, kubelets, arrivals, database_url, limit_s, say)
            if native and kueue:
                try:
                    out["kueue_jobs"] = run_kueue_jobs(
                        plane, api, kubelets, arrivals, folder / "kueue-jobs", limit_s, say
                    )
                except Exception as error:  # the report says what failed
                    out["kueue_jobs"] = {"error": f"{type(error).__name__}: {error}"}
            elif native:
                out["kueue_jobs"] = {"skipped": KUEUE_LEFT_OUT}
            if native:
                out["gantry_native"] = run_gantry_native(
                    api, kubelets, arrivals, database_url, limit_s, say,
                    kubeconfig=plane.kubeconfig, log_dir=folder,
                )  # fmt: skip
        finally:
            stop.set()
            if beating is not None:
                beating.join(timeout=15)
            api.close()
    return out


def _heartbeats(kubelets: Kubelets, stop: threading.Event, every_s: float = 10.0) -> None:
    while not stop.wait(every_s):
        with contextlib.suppress(Exception):  # one missed beat is harmless; the next renews
            kubelets.heartbeat()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Kueue's scenario by Kueue and by Gantry")
    parser.add_argument("--fraction", type=float, default=0.1, help="of each queue's workloads")
    parser.add_argument("--no-kueue", action="store_true", help="run Gantry alone")
    parser.add_argument(
        "--native",
        action="store_true",
        help="also run the halves from batch/v1 Jobs: Kueue's with kube-scheduler "
        "(kueue_jobs) and Gantry's Kubernetes-native path (gantry_native)",
    )
    parser.add_argument(
        "--native-only",
        action="store_true",
        help="run only the halves from batch/v1 Jobs (implies --native)",
    )
    parser.add_argument("--database-url", default=DEFAULT_DATABASE_URL)
    parser.add_argument("--limit", type=float, default=900.0, help="give up after, s (each)")
    parser.add_argument("--plane-dir", type=Path, help="the control plane's folder (a temp one)")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    if not 0 < args.fraction <= 1:
        parser.error("--fraction must be in (0, 1]")
    work = Path(tempfile.mkdtemp(prefix="k8s-kueue-"))
    folder = args.plane_dir or work / "plane"
    out = run_kueue_scenario(lambda: own_plane(folder), args.fraction, kueue=not args.no_kueue,
                             native=args.native or args.native_only,
                             from_database=not args.native_only,
                             database_url=args.database_url, limit_s=args.limit,
                             work_dir=work)  # fmt: skip
    print(json.dumps(out, indent=2))
    if args.json:
        args.json.write_text(json.dumps(out, indent=2) + "\n")


if __name__ == "__main__":
    main()
