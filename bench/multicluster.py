"""Kueue's scenario split over two clusters: Gantry's federated daemon against MultiKueue.

    python -m bench.multicluster --fraction 0.1 --json out.json
    python -m bench.multicluster --fraction 0.01 --no-multikueue --json out.json   # Gantry only

The scenario is bench.k8s_kueue's (Kueue's scheduler performance baseline: 30 queues in 5
cohorts, small, medium and large workloads at their intervals), its 75 nodes of 8 GPUs split
over two clusters, each a real control plane of its own (etcd, kube-apiserver, the controller
manager) whose nodes `devcluster.kubelets` plays, ending each pod after its job's duration.

- **Gantry**: one installation drives both planes, a Cluster row and a Kubernetes backend
  each, through its FederatedBackend (docs/multicluster.md); the jobs are inserted at their
  arrival times and the daemon places each on one cluster (`bench.k8s_kueue.run_gantry`).
- **MultiKueue** (Kueue v0.17.0, `python -m devcluster build --peers`): a third plane is the
  manager, with Kueue's manager and its MultiKueue configuration (a MultiKueueCluster per
  worker with its kubeconfig Secret, a MultiKueueConfig, an AdmissionCheck on every
  ClusterQueue); each worker plane runs Kueue and kube-scheduler, its ClusterQueues holding
  its share of the nominal quota. Each arrival is a batch/v1 Job created on the manager, queued,
  suspended and managed by MultiKueue as Kueue's webhook would leave it (no webhook is
  registered, as in bench.k8s_kueue); MultiKueue copies its Workload to both workers, keeps the
  first that reserves quota and creates the Job there; the worker's job controller makes the
  pods and kube-scheduler binds them.

Figures: wall time (first arrival to the last job finished), mean time to admission per class
(creation to first admission: Gantry's `admitted` event; the manager's Workload Admitted), and
for Gantry the jobs that ran twice: the jobs whose pods the two planes' kubelets ran at
overlapping times, or one attempt's pods on both planes (each pod counted as running from its
start for its whole duration: an upper bound, so 0 is 0). Where MultiKueue cannot be built or
run, its half says which step failed and the error; nothing stands in for it.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import sys
import tempfile
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from bench.k8s_kueue import (
    DURATION_ENV,
    GPU,
    GPUS_PER_NODE,
    PRODUCT,
    Arrival,
    KueueJobsDriver,
    World,
    _json,
    _true,
    _wait_queues_active,
    create_queues,
    gantry_backend,
    kueue_missing,
    kueue_namespace,
    kueue_process,
    node_names,
    own_plane,
    plan,
    pod_duration,
    queue_objects,
    run_gantry,
)
from devcluster import versions
from devcluster.kubelets import Kubelets, NodeShape
from devcluster.plane import ControlPlane

Say = Callable[[str], None]
CLUSTERS = ("east", "west")
DEFAULT_DATABASE_URL = "postgres://postgres@127.0.0.1:5432/gantry_multicluster"
MULTIKUEUE = "multikueue"  # the AdmissionCheck's and the MultiKueueConfig's name
MULTIKUEUE_CONTROLLER = "kueue.x-k8s.io/multikueue"
JOB_NAME_LABEL = "batch.kubernetes.io/job-name"
MULTIKUEUE_LEFT_OUT = "left out (--no-multikueue): Gantry's half alone"
READY_TIMEOUT_S = 120.0


def _say(message: str) -> None:
    print(f"multicluster: {message}", file=sys.stderr, flush=True)


def split_nodes(names: list[str], clusters: tuple[str, ...] = CLUSTERS) -> dict[str, list[str]]:
    """The scenario's nodes in contiguous shares, the first clusters taking one more."""
    share, extra = divmod(len(names), len(clusters))
    out, start = {}, 0
    for i, cluster in enumerate(clusters):
        end = start + share + (1 if i < extra else 0)
        out[cluster] = names[start:end]
        start = end
    return out


# -- who ran where -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Run:
    plane: str
    job: str
    attempt: str
    start: float
    end: float  # start + its duration: the latest it could have stopped


@dataclass
class Runs:
    """The pods each plane's kubelets started, by job, on the monotonic clock: each simulator's
    `duration` asks here (it is called when a pod's containers start)."""

    runs: list[Run] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def duration_for(self, plane: str) -> Callable[[dict[str, Any]], float | None]:
        def duration(pod: dict[str, Any]) -> float | None:
            seconds = pod_duration(pod)
            job, attempt = run_of(pod)
            if job:
                now = time.monotonic()
                end = now + seconds if seconds is not None else math.inf
                with self.lock:
                    self.runs.append(Run(plane, job, attempt, now, end))
            return seconds

        return duration

    def clear(self) -> None:
        with self.lock:
            self.runs.clear()

    def ran_twice(self) -> int:
        """Jobs with runs on two planes that overlapped in time or were the same attempt."""
        with self.lock:
            by_job: dict[str, list[Run]] = defaultdict(list)
            for run in self.runs:
                by_job[run.job].append(run)
        return sum(1 for runs in by_job.values() if _twice(runs))


def _twice(runs: list[Run]) -> bool:
    return any(
        a.plane != b.plane and (a.attempt == b.attempt or (a.start < b.end and b.start < a.end))
        for i, a in enumerate(runs)
        for b in runs[i + 1 :]
    )


def run_of(pod: dict[str, Any]) -> tuple[str, str]:
    """(job, attempt) of a pod: Gantry's labels, else the batch/v1 Job's name and uid (a Job
    MultiKueue made again is another attempt)."""
    from scheduler.backends.kubernetes.render import LABEL_ATTEMPT, LABEL_JOB

    labels = pod["metadata"].get("labels") or {}
    if LABEL_JOB in labels:
        return labels[LABEL_JOB], labels.get(LABEL_ATTEMPT, "")
    owners: list[dict[str, Any]] = pod["metadata"].get("ownerReferences") or []
    return labels.get(JOB_NAME_LABEL, ""), owners[0].get("uid", "") if owners else ""


# -- the worker planes ---------------------------------------------------------------------------


@dataclass
class Worker:
    name: str
    plane: ControlPlane
    api: Any
    kubelets: Kubelets


@contextlib.contextmanager
def worker_planes(work: Path, runs: Runs, *, scheduler: bool) -> Iterator[dict[str, Worker]]:
    """Both clusters' planes, started at once, their share of the nodes registered; stopped
    afterwards. kube-scheduler runs in each when MultiKueue's workers need it."""
    from kubernetes import config as kube_config

    with contextlib.ExitStack() as stack:
        planes = {cluster: ControlPlane(work / cluster) for cluster in CLUSTERS}
        for plane in planes.values():
            stack.callback(plane.stop)
        with ThreadPoolExecutor(len(planes)) as pool:  # each waits for its own servers
            # As bench.k8s_kueue.own_plane: no node lifecycle controller to mark a node late.
            for future in [
                pool.submit(p.start, controller_manager=True, controllers="*,-nodelifecycle")
                for p in planes.values()
            ]:
                future.result()
        workers: dict[str, Worker] = {}
        for cluster, nodes in split_nodes(node_names()).items():
            plane = planes[cluster]
            if scheduler:
                plane.start_scheduler()
            api = kube_config.new_client_from_config(str(plane.kubeconfig))
            stack.callback(api.close)
            kubelets = Kubelets(api, duration=runs.duration_for(cluster))
            kubelets.add_nodes(nodes, NodeShape(gpus=GPUS_PER_NODE, product=PRODUCT))
            workers[cluster] = Worker(cluster, plane, api, kubelets)
        yield workers


# -- Gantry ------------------------------------------------------------------------------------


def _federated_world(workers: dict[str, Worker]) -> World:
    """The scenario's organisation and classes, a Cluster row per plane and the federation of
    their Kubernetes backends, as `backend_for_clusters` builds it from the rows."""
    from bench.kueue_e2e import setup
    from scheduler.backends.federated import Member, federate
    from scheduler.models import Cluster

    org, classes = setup()
    members = []
    for name, worker in workers.items():
        Cluster.objects.create(
            name=name, backend="kubernetes", kubeconfig_path=str(worker.plane.kubeconfig)
        )
        members.append(Member(name, gantry_backend(worker.api, classes)))
    return org, classes, federate(members)


def run_gantry_federated(
    workers: dict[str, Worker], runs: Runs, arrivals: list[Arrival], database_url: str | None,
    limit_s: float, say: Say,
) -> dict[str, Any]:  # fmt: skip
    runs.clear()
    first = next(iter(workers.values()))
    figures = run_gantry(first.api, [w.kubelets for w in workers.values()], arrivals,
                         database_url, limit_s, say,
                         world=lambda: _federated_world(workers))  # fmt: skip
    say(f"Gantry: {figures['finished']} of {figures['workloads']} finished, usage "
        f"{figures['usage_pct']} %, {figures['preemptions']} preemptions")  # fmt: skip
    return {
        "wall_s": figures["wall_s"],
        "admission_mean_s": figures["admission_mean_s"],
        "ran_twice": runs.ran_twice(),
    }


# -- MultiKueue ----------------------------------------------------------------------------------


def worker_kubeconfig(plane: ControlPlane) -> dict[str, Any]:
    """The worker's admin kubeconfig with its certificates inline: MultiKueue refuses file
    paths in a kubeconfig Secret (its validateKubeconfig)."""
    import base64

    def inline(path: Path) -> str:
        return base64.b64encode(path.read_bytes()).decode()

    cert, key = plane.pki.client("admin")
    return {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {
                "name": "worker",
                "cluster": {
                    "server": plane.url,
                    "certificate-authority-data": inline(plane.pki.ca),
                },
            }
        ],
        "users": [
            {
                "name": "admin",
                "user": {
                    "client-certificate-data": inline(cert),
                    "client-key-data": inline(key),
                },
            }
        ],
        "contexts": [{"name": "worker", "context": {"cluster": "worker", "user": "admin"}}],
        "current-context": "worker",
    }


def multikueue_objects(clusters: tuple[str, ...]) -> list[tuple[str, dict[str, Any]]]:
    """(plural, object): a MultiKueueCluster per worker (its kubeconfig in the Secret
    `<worker>-kubeconfig`), the MultiKueueConfig naming them, the AdmissionCheck using it."""
    from bench.k8s_kueue import GROUP, VERSION

    api_version = f"{GROUP}/{VERSION}"
    out: list[tuple[str, dict[str, Any]]] = [
        (
            "multikueueclusters",
            {
                "apiVersion": api_version,
                "kind": "MultiKueueCluster",
                "metadata": {"name": name},
                "spec": {
                    "clusterSource": {
                        "kubeConfig": {"locationType": "Secret", "location": f"{name}-kubeconfig"}
                    }
                },
            },
        )
        for name in clusters
    ]
    out.append(
        (
            "multikueueconfigs",
            {
                "apiVersion": api_version,
                "kind": "MultiKueueConfig",
                "metadata": {"name": MULTIKUEUE},
                "spec": {"clusters": list(clusters)},
            },
        )
    )
    out.append(
        (
            "admissionchecks",
            {
                "apiVersion": api_version,
                "kind": "AdmissionCheck",
                "metadata": {"name": MULTIKUEUE},
                "spec": {
                    "controllerName": MULTIKUEUE_CONTROLLER,
                    "parameters": {
                        "apiGroup": GROUP,
                        "kind": "MultiKueueConfig",
                        "name": MULTIKUEUE,
                    },
                },
            },
        )
    )
    return out


def multikueue_job(arrival: Arrival) -> dict[str, Any]:
    """The batch/v1 Job of `arrival` on the manager, as Kueue's webhook leaves it: queued,
    suspended, managed by MultiKueue (the manager's job controller leaves it alone)."""
    container = {
        "name": "main",
        "image": "bench/job:1",
        "env": [{"name": DURATION_ENV, "value": str(arrival.duration_s)}],
        "resources": {
            "requests": {GPU: str(arrival.gpus)},
            "limits": {GPU: str(arrival.gpus)},
        },
    }
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {
            "name": arrival.name,
            "namespace": kueue_namespace(arrival.queue),
            "labels": {
                "kueue.x-k8s.io/queue-name": arrival.queue,
                "kueue.x-k8s.io/priority-class": f"kueue-{arrival.klass}",
            },
        },
        "spec": {
            "suspend": True,
            "managedBy": MULTIKUEUE_CONTROLLER,
            "parallelism": arrival.replicas,
            "completions": arrival.replicas,
            "backoffLimit": 0,
            "template": {"spec": {"restartPolicy": "Never", "containers": [container]}},
        },
    }


class MultiKueueDriver(KueueJobsDriver):
    """Creates each arrival's Job on the manager and watches the manager's Workloads. The pods
    end on their own (the workers' kubelets), and Kueue's job controllers requeue what was
    evicted."""

    def job(self, arrival: Arrival) -> dict[str, Any]:
        return multikueue_job(arrival)


def _manager_config(config: dict[str, Any]) -> None:
    config["multiKueue"] = {"gcInterval": "1m", "origin": MULTIKUEUE, "workerLostTimeout": "15m"}


def _wait_check_active(api: Any, timeout_s: float = READY_TIMEOUT_S) -> None:
    """Until the AdmissionCheck is Active (its clusters connected); else what it says."""
    from kubernetes import client

    from bench.k8s_kueue import GROUP, VERSION

    custom: Any = client.CustomObjectsApi(api)
    deadline = time.monotonic() + timeout_s
    while True:
        check = _json(
            custom.get_cluster_custom_object(
                GROUP, VERSION, "admissionchecks", MULTIKUEUE, _preload_content=False
            )
        )
        if _true(check, "Active"):
            return
        if time.monotonic() > deadline:
            clusters = _json(
                custom.list_cluster_custom_object(
                    GROUP, VERSION, "multikueueclusters", _preload_content=False
                )
            )["items"]
            said = {
                c["metadata"]["name"]: (c.get("status") or {}).get("conditions") for c in clusters
            }
            raise RuntimeError(
                f"AdmissionCheck {MULTIKUEUE} not active within {timeout_s:.0f} s: "
                f"{(check.get('status') or {}).get('conditions')}; clusters: {said}"
            )
        time.sleep(0.5)


def run_multikueue(
    workers: dict[str, Worker], arrivals: list[Arrival], work: Path, limit_s: float, say: Say
) -> dict[str, Any]:
    """MultiKueue's half: its figures, or `error` naming the step that failed and why."""
    from kubernetes import client
    from kubernetes import config as kube_config

    missing = kueue_missing()
    if missing:
        return {"error": missing}
    step = "start the manager plane"
    try:
        with contextlib.ExitStack() as stack:
            manager = stack.enter_context(own_plane(work / "manager"))
            manager_api = kube_config.new_client_from_config(str(manager.kubeconfig))
            stack.callback(manager_api.close)
            nominal = 20 // len(workers)  # each worker's share of a queue's nominal quota
            for name, worker in workers.items():
                step = f"start Kueue on worker {name}"
                stack.enter_context(kueue_process(worker.plane, worker.api,
                                                  work / f"kueue-{name}", say))  # fmt: skip
                step = f"create worker {name}'s queues"
                create_queues(worker.api, arrivals, queue_objects(nominal=nominal))
                _wait_queues_active(worker.api)
            step = "start Kueue's manager"
            stack.enter_context(kueue_process(manager, manager_api, work / "kueue-manager", say,
                                              configure=_manager_config))  # fmt: skip
            step = "configure MultiKueue"
            core: Any = client.CoreV1Api(manager_api)
            custom: Any = client.CustomObjectsApi(manager_api)
            for name, worker in workers.items():
                secret = {
                    "metadata": {"name": f"{name}-kubeconfig", "namespace": "kueue-system"},
                    "stringData": {"kubeconfig": yaml.safe_dump(worker_kubeconfig(worker.plane))},
                }
                _json(core.create_namespaced_secret("kueue-system", secret,
                                                    _preload_content=False))  # fmt: skip
            from bench.k8s_kueue import GROUP, VERSION

            for plural, body in multikueue_objects(tuple(workers)):
                _json(custom.create_cluster_custom_object(GROUP, VERSION, plural, body,
                                                          _preload_content=False))  # fmt: skip
            _wait_check_active(manager_api)
            step = "create the manager's queues"
            create_queues(manager_api, arrivals, queue_objects(admission_checks=(MULTIKUEUE,)))
            _wait_queues_active(manager_api)
            step = "run the scenario"
            say(f"MultiKueue: {len(arrivals)} Jobs on the manager, {len(workers)} workers")
            driver = MultiKueueDriver(manager_api, arrivals)
            tally = _with_kubelets(workers, lambda: driver.run(limit_s))
            step = "stop Kueue"
    except Exception as error:  # the report says what failed
        return {"error": f"{step}: {type(error).__name__}: {error}"}
    figures = tally.figures(arrivals)
    say(f"MultiKueue: {figures['finished']} of {len(arrivals)} finished, usage "
        f"{figures['usage_pct']} %, driver errors {driver.errors[:3]}")  # fmt: skip
    if figures["finished"] < len(arrivals):
        return {
            "error": f"run the scenario: {figures['finished']} of {len(arrivals)} Jobs "
            f"finished within {limit_s:.0f} s (admitted {figures['admitted']})"
        }
    return {"wall_s": figures["wall_s"], "admission_mean_s": figures["admission_mean_s"]}


def _with_kubelets(workers: dict[str, Worker], body: Callable[[], Any]) -> Any:
    """`body()` while every worker's simulated kubelets run."""
    stop = threading.Event()
    threads = [
        threading.Thread(target=w.kubelets.run, args=(stop, 0.05, float("inf")), daemon=True)
        for w in workers.values()
    ]
    for thread in threads:
        thread.start()
    try:
        return body()
    finally:
        stop.set()
        for thread in threads:
            thread.join(timeout=15)


# -- both ----------------------------------------------------------------------------------------


def run_multicluster(
    fraction: float, *, multikueue: bool = True, database_url: str | None = DEFAULT_DATABASE_URL,
    limit_s: float = 900.0, work_dir: Path | None = None, say: Say = _say,
) -> dict[str, Any]:  # fmt: skip
    """Kueue's scenario at `fraction` over two planes, by Gantry's federation, then by
    MultiKueue (`multikueue=False`: its half says it was left out). Gantry's jobs go to a
    fresh database at `database_url`, or to Django's as it is when None (a test's)."""
    arrivals = plan(fraction)
    work = work_dir or Path(tempfile.mkdtemp(prefix="multicluster-"))
    runs = Runs()
    out: dict[str, Any] = {"clusters": len(CLUSTERS)}
    with worker_planes(work, runs, scheduler=multikueue) as workers:
        say(f"{len(arrivals)} jobs over {len(workers)} planes of "
            f"{', '.join(str(len(w.kubelets.nodes)) for w in workers.values())} nodes")  # fmt: skip
        out["gantry"] = run_gantry_federated(workers, runs, arrivals, database_url, limit_s, say)
        if multikueue:
            runs.clear()
            out["multikueue"] = run_multikueue(workers, arrivals, work, limit_s, say)
            say(f"MultiKueue: jobs run on both workers at once: {runs.ran_twice()}")
        else:
            out["multikueue"] = {"error": MULTIKUEUE_LEFT_OUT}
    out["versions"] = {
        "kubernetes": versions.KUBERNETES,
        "etcd": versions.ETCD,
        "kueue": versions.KUEUE,
    }
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Kueue's scenario over two clusters")
    parser.add_argument("--fraction", type=float, default=0.1, help="of each queue's workloads")
    parser.add_argument("--no-multikueue", action="store_true", help="run Gantry alone")
    parser.add_argument("--database-url", default=DEFAULT_DATABASE_URL)
    parser.add_argument("--limit", type=float, default=900.0, help="give up after, s (each)")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    if not 0 < args.fraction <= 1:
        parser.error("--fraction must be in (0, 1]")
    out = run_multicluster(args.fraction, multikueue=not args.no_multikueue,
                           database_url=args.database_url, limit_s=args.limit)  # fmt: skip
    print(json.dumps(out, indent=2))
    if args.json:
        args.json.write_text(json.dumps(out, indent=2) + "\n")


if __name__ == "__main__":
    main()
