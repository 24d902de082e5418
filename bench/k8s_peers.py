"""Gantry beside the real kube-scheduler on one real control plane (issue 22).

    PYTHONPATH=. python -m bench.k8s_peers --json out.json [--nodes 5000 --pods 10000]

The benchmark starts its own control plane (devcluster: etcd, kube-apiserver,
kube-controller-manager, and kube-scheduler built from the same k8s.io/kubernetes release),
registers `--nodes` simulated nodes of 8 GPUs (devcluster.kubelets), and runs, one scheduler
after the other on the same nodes (the pods of the first deleted before the second starts):

- kube-scheduler: `--pods` pods of one `nvidia.com/gpu` each (an extended resource), rendered
  as Gantry renders its own (restricted Pod Security, same requests, priority class and
  tolerations) but with the default schedulerName, created by `--creators` client threads as
  fast as they go. Creation: the moment the create request is sent. Twice: created first,
  then kube-scheduler started (`kube_scheduler`: how scheduler_perf measures, and how Gantry
  is measured here), and created while it runs (`kube_scheduler_arrival_paced`: its rate is
  then the creators').
- Gantry: the same number of one-GPU jobs inserted as queued rows in bulk (as
  bench/kueue_e2e.py's submitter does), then the daemon in this process with the Kubernetes
  backend: it creates each pod on its node, concurrently (docs/kubernetes.md, "Binding"), at
  kube-scheduler's client-side rate here. Creation: the job's submission time (`created_at`,
  taken before the insert), the moment that compares with the pod's creation above.

Bound, for both: the arrival, on this host's clock, of the first watch event that shows the pod
with `spec.nodeName` set. The watch runs in its own process, so neither a busy daemon nor busy
client threads delay the reading. The PodScheduled condition's lastTransitionTime is not used:
it has whole seconds only.

pods_per_s = pods / (last bound - the scheduler's start); `started_s`: that start, after the
first creation (created first: kube-scheduler is started, and Gantry's daemon runs, once every
pod or job exists; arrival-paced: the first creation). p50/p99: of (bound - created) per pod, as
the issue asks, and `p50_from_start_s` / `p99_from_start_s` of (bound - the later of its
creation and the scheduler's start): created first, a pod created while its scheduler was not
yet running waits for the creations after it (kube-scheduler's 10,000 pods took the client 12
to 28 s here, Gantry's rows under 2 s), which is no scheduler's doing. `first_bound_s`: the start
to the first pod bound (kube-scheduler's includes its process start and its caches' sync;
Gantry's inventory is synced before its clock starts, as its daemon keeps it between cycles).
`cpu_s`: the CPU seconds each kind of process used from the scheduler's start to its last pod
bound (`cpu_seconds`: the plane's processes by command, PostgreSQL, this process, the others).
`pods_per_s_from_creation` is the figure the runs before 2026-12-07 reported as pods_per_s
(over the span from the first creation): it counts kube-scheduler's creation time, when it was
not running, against it.

The node lifecycle controller runs, as in a real cluster: a process of the benchmark's own
(forked, `bench.daemon_setup.apart`) renews every simulated node's Lease every 20 s
(devcluster.kubelets' heartbeat, concurrent), competing with the schedulers for the machine's
cores but not for the interpreter lock of Gantry's daemon, which runs in this process (until
2026-12-07 the heartbeats were a thread here, beside the daemon's call threads). The JSON's
`heartbeat` says how long the rounds took (`max_round_s` must stay within the controller's
grace period, 50 s) and how many nodes were not Ready at the end (`not_ready_at_end`: 0, or the
run measured on a shrinking cluster).
`--no-node-lifecycle` runs without that controller and without the heartbeats.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import importlib
import json
import multiprocessing
import os
import queue
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.daemon_setup import apart

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_URL = "postgres://postgres@127.0.0.1:5432/gantry_k8s_peers"
MANAGED = "app.kubernetes.io/managed-by"
KUBE_NAMESPACE, GANTRY_NAMESPACE = "peers-kube", "peers-gantry"
PRIORITY = "normal"  # Gantry's seeded class; its pods name gantry-normal
GPUS_PER_NODE = 8
DELETE_PAGE = 500  # pods per delete-collection request
# The simulated nodes renew their leases every 20 s, not a kubelet's 10 s: 5,000 renewals every
# 10 s are most of this machine's API server, and the node lifecycle controller only asks that
# a lease be younger than its grace period (50 s in v1.37).
RENEW_EVERY_S = 20.0


def done(response: Any) -> Any:
    """The parsed body of a `_preload_content=False` answer, its connection back in the pool.

    Releasing a connection whose body is still unread hands the next request a socket with the
    rest of this body in it, whenever the body had not yet arrived when the pool checked the
    socket (the next answer then fails with BadStatusLine: a pod's JSON read as a status line).
    """
    try:
        body = response.data
    finally:
        response.release_conn()
    return json.loads(body) if body else None


# -- the watch, in its own process ---------------------------------------------------------------


def watch_bound(kubeconfig: str, out: Any, stop: Any) -> None:
    """Put (namespace, name, job id label, time) on `out` the first time each of Gantry-rendered
    pods is seen bound; ("ready",) once the watch is open. Runs until `stop` is set."""
    from kubernetes import client, config
    from kubernetes.watch.watch import iter_resp_lines

    api = config.new_client_from_config(kubeconfig)
    core: Any = client.CoreV1Api(api)
    seen: set[tuple[str, str]] = set()
    selector = f"{MANAGED}=gantry"

    def note(pod: dict[str, Any], at: float) -> None:
        meta = pod["metadata"]
        key = (meta["namespace"], meta["name"])
        if key not in seen and (pod.get("spec") or {}).get("nodeName"):
            seen.add(key)
            out.put((*key, (meta.get("labels") or {}).get("gantry.io/job-id", ""), at))

    def relist() -> str:
        body = done(
            core.list_pod_for_all_namespaces(label_selector=selector, _preload_content=False)
        )
        at = time.time()
        for pod in body["items"]:
            note(pod, at)
        return str(body["metadata"]["resourceVersion"])

    version = relist()
    out.put(("ready",))
    while not stop.is_set():
        response = core.list_pod_for_all_namespaces(
            label_selector=selector,
            watch=True,
            resource_version=version,
            allow_watch_bookmarks=True,
            timeout_seconds=5,  # short, so that `stop` is seen soon
            _preload_content=False,
        )
        try:
            for line in iter_resp_lines(response):
                at = time.time()
                event = json.loads(line)
                obj = event["object"]
                if event["type"] == "ERROR":
                    version = relist()  # 410 Gone: start over from a fresh list
                    break
                version = obj["metadata"]["resourceVersion"]
                if event["type"] in ("ADDED", "MODIFIED"):
                    note(obj, at)
        finally:
            response.close()  # a stream left mid-body must not go back to the pool


@dataclass
class Bound:
    """What the watch process reported, collected by a thread of this process."""

    at: dict[tuple[str, str], float] = field(default_factory=dict)
    job_ids: dict[tuple[str, str], str] = field(default_factory=dict)
    changed: threading.Condition = field(default_factory=threading.Condition)

    def count(self, namespace: str) -> int:
        with self.changed:
            return sum(1 for ns, _ in self.at if ns == namespace)

    def wait_for(self, namespace: str, pods: int, deadline: float) -> int:
        with self.changed:
            while (n := sum(1 for ns, _ in self.at if ns == namespace)) < pods:
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                self.changed.wait(min(left, 1.0))
            return n


@contextlib.contextmanager
def watching(kubeconfig: Path) -> Iterator[Bound]:
    context = multiprocessing.get_context("spawn")
    events: Any = context.Queue()
    stop = context.Event()
    process = context.Process(target=watch_bound, args=(str(kubeconfig), events, stop))
    process.start()
    try:
        first = events.get(timeout=60)
    except queue.Empty:
        process.kill()
        raise RuntimeError("the pod watch did not start within 60 s") from None
    assert first == ("ready",), first
    bound = Bound()
    done = threading.Event()

    def collect() -> None:
        while not done.is_set():
            try:
                namespace, name, job_id, at = events.get(timeout=0.2)
            except queue.Empty:
                continue
            with bound.changed:
                bound.at[(namespace, name)] = at
                bound.job_ids[(namespace, name)] = job_id
                bound.changed.notify_all()

    collector = threading.Thread(target=collect, name="bound-collector", daemon=True)
    collector.start()
    try:
        yield bound
    finally:
        stop.set()
        process.join(timeout=15)
        if process.is_alive():
            process.kill()
            process.join()
        done.set()
        collector.join()


# -- figures -------------------------------------------------------------------------------------

PLANE_COMMANDS = {"etcd", "kube-apiserver", "kube-controller", "kube-scheduler"}


def cpu_seconds() -> dict[str, float]:
    """The CPU seconds (user and system) the processes on this host have used so far, by kind:
    the control plane's by command (`kube-controller` is the controller manager), PostgreSQL's,
    this process's (`benchmark`: Gantry's daemon runs in it) and every other's (`other`: the
    heartbeats, the watch, the rest of the host); `idle`, the host's idle seconds over all its
    cores. Read from /proc: a process that exits takes its seconds with it."""
    tick = os.sysconf("SC_CLK_TCK")
    own = os.getpid()
    used: dict[str, float] = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            stat = Path(entry.path, "stat").read_text()
        except OSError:  # gone meanwhile
            continue
        command = stat[stat.index("(") + 1 : stat.rindex(")")]
        fields = stat[stat.rindex(")") + 2 :].split()  # from the 3rd field, the state
        seconds = (int(fields[11]) + int(fields[12])) / tick  # utime and stime, fields 14, 15
        if int(entry.name) == own:
            kind = "benchmark"
        elif command in PLANE_COMMANDS or command == "postgres":
            kind = command
        else:
            kind = "other"
        used[kind] = used.get(kind, 0.0) + seconds
    cpu = Path("/proc/stat").read_text().split("\n", 1)[0].split()
    used["idle"] = (int(cpu[4]) + int(cpu[5])) / tick  # idle and iowait
    return used


def cpu_used(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    """The seconds each kind used between two readings of `cpu_seconds`, busiest first (none
    below 0: a process that exited between them took its earlier seconds away)."""
    spent = {kind: max(0.0, after[kind] - before.get(kind, 0.0)) for kind in after}
    return {kind: round(spent[kind], 1) for kind in sorted(spent, key=lambda k: -spent[k])}


def figures(
    created: dict[Any, float], bound: dict[Any, float], started: float | None = None
) -> dict[str, Any]:
    """The module's figures over the pods both created and bound, the scheduler started at
    `started` (time.time(); None: at the first creation, as arrival-paced); `created_s`, the
    span of the creations, says whether the creating side set the pace."""
    from bench.daemon_setup import percentile

    both = [key for key in created if key in bound]
    first = min(created.values()) if created else 0.0
    start = first if started is None else max(first, started)
    latencies = [bound[key] - created[key] for key in both]
    waited = [bound[key] - max(created[key], start) for key in both]
    last = max((bound[k] for k in both), default=start)
    span, whole = last - start, last - first

    def rate(seconds: float) -> float:
        return round(len(both) / seconds, 1) if seconds > 0 else 0.0

    return {
        "pods_per_s": rate(span),
        "p50_s": round(percentile(latencies, 50), 3),
        "p99_s": round(percentile(latencies, 99), 3),
        "p50_from_start_s": round(percentile(waited, 50), 3),
        "p99_from_start_s": round(percentile(waited, 99), 3),
        "bound": len(both),
        "wall_s": round(span, 2),
        "started_s": round(start - first, 2),
        "first_bound_s": round(min(bound[k] for k in both) - start, 2) if both else None,
        "created_s": round(max(created.values()) - first, 2) if created else 0.0,
        "pods_per_s_from_creation": rate(whole),
    }


# -- the plane and its nodes ---------------------------------------------------------------------


def apply_priority_classes(api: Any) -> None:
    import yaml
    from kubernetes import client

    scheduling: Any = client.SchedulingV1Api(api)
    for doc in yaml.safe_load_all((ROOT / "platform/k8s/01-priorityclasses.yaml").read_text()):
        if not doc:
            continue
        try:
            done(scheduling.create_priority_class(doc, _preload_content=False))
        except client.ApiException as error:
            if error.status != 409:
                raise


def admin_client(kubeconfig: Path, pool: int) -> Any:
    from kubernetes import client, config

    configuration = client.Configuration()
    config.load_kube_config(config_file=str(kubeconfig), client_configuration=configuration)
    configuration.retries = False
    configuration.connection_pool_maxsize = pool  # one connection per creating thread
    return client.ApiClient(configuration)


def node_names(count: int) -> list[str]:
    return [f"sim-{i:05d}" for i in range(count)]


def register(api: Any, names: list[str], shape: Any, threads: int) -> Any:
    """The nodes registered by `threads` threads at once into one simulator, which renews the
    leases of those registered so far meanwhile (registering thousands takes minutes, longer
    than the node lifecycle controller waits)."""
    from devcluster.kubelets import Kubelets

    kubelets = Kubelets(api, renew_every_s=RENEW_EVERY_S)
    stop = threading.Event()
    beats = threading.Thread(target=kubelets.beat, args=(stop,), name="registering", daemon=True)
    beats.start()
    try:
        chunks = [names[i::threads] for i in range(threads)]
        with ThreadPoolExecutor(threads, thread_name_prefix="register") as pool:
            list(pool.map(lambda chunk: kubelets.add_nodes(chunk, shape), chunks))
    finally:
        stop.set()
        beats.join()
    return kubelets


def delete_pods(api: Any, namespace: str, deadline_s: float = 600.0) -> None:
    """Delete every pod of `namespace` (no kubelet confirms: grace 0), a page at a time: one
    collection of 10,000 outlasts the API server's request timeout, which closes the
    connection with the deletion half done."""
    from kubernetes import client

    core: Any = client.CoreV1Api(api)
    deadline = time.monotonic() + deadline_s
    while time.monotonic() < deadline:
        left = done(core.list_namespaced_pod(namespace, limit=1, _preload_content=False))
        if not left["items"]:
            return
        done(
            core.delete_collection_namespaced_pod(
                namespace, grace_period_seconds=0, limit=DELETE_PAGE, _preload_content=False
            )
        )
    raise RuntimeError(f"pods of {namespace} still there after {deadline_s:.0f} s")


# -- kube-scheduler ------------------------------------------------------------------------------


def kube_pod(index: int) -> dict[str, Any]:
    """Pod `index` as Gantry renders a one-GPU job's pod, for the default scheduler."""
    from scheduler.backends.base import PodRequest, pod_name
    from scheduler.backends.kubernetes.config import KubernetesConfig
    from scheduler.backends.kubernetes.render import render_pod

    request = PodRequest(
        name=pod_name(index, 0, 0),
        namespace=KUBE_NAMESPACE,
        job_id=index,
        attempt=0,
        replica=0,
        replicas=1,
        node="",
        gpu_indices=(),
        gpu_milli=1000,
        gpu_memory_mib=None,
        cpu_milli=1000,
        memory_mib=1024,
        image="bench/job:1",
        command=("run",),
        env={},
        priority_class=PRIORITY,
        job_type="batch",
    )
    return render_pod(request, KubernetesConfig(scheduler_name="default-scheduler"))


def scheduler_ready(api: Any, deadline_s: float = 120.0) -> None:
    """kube-scheduler has no health port here: wait until it binds a probe pod (its caches are
    then synced), outside the measured namespace, then delete the probe."""
    from kubernetes import client

    core: Any = client.CoreV1Api(api)
    probe = kube_pod(0)
    probe["metadata"] = {"name": "scheduler-probe", "namespace": "default"}
    done(core.create_namespaced_pod("default", probe, _preload_content=False))
    deadline = time.monotonic() + deadline_s
    try:
        while time.monotonic() < deadline:
            response = core.read_namespaced_pod(
                "scheduler-probe", "default", _preload_content=False
            )
            node = done(response)["spec"].get("nodeName")
            if node:
                return
            time.sleep(0.2)
        raise RuntimeError(f"kube-scheduler bound nothing in {deadline_s:.0f} s")
    finally:
        done(
            core.delete_namespaced_pod(
                "scheduler-probe", "default", grace_period_seconds=0, _preload_content=False
            )
        )


def run_kube_scheduler(
    plane: Any,
    api: Any,
    bound: Bound,
    pods: int,
    creators: int,
    limit_s: float,
    log: Callable[[str], None],
    *,
    created_first: bool = True,
) -> dict[str, Any]:
    """kube-scheduler binding `pods` pods. `created_first` (scheduler_perf's way, and
    Gantry's here: its jobs are in the queue before its daemon starts): every pod is created
    while kube-scheduler is stopped, then it starts; else they are created while it runs, as
    fast as the client threads go (arrival-paced: its rate is then the creators')."""
    from kubernetes import client

    from scheduler.backends.kubernetes.backend import KubernetesBackend
    from scheduler.backends.kubernetes.config import KubernetesConfig

    KubernetesBackend(api, KubernetesConfig()).ensure_namespace(KUBE_NAMESPACE)
    core: Any = client.CoreV1Api(api)
    # Rendered before the clock starts; named apart from another run's, whose bound times the
    # watch keeps.
    first = 1 if created_first else pods + 1
    manifests = [kube_pod(first + i) for i in range(pods)]
    created: dict[tuple[str, str], float] = {}

    def create(manifest: dict[str, Any]) -> None:
        key = (KUBE_NAMESPACE, manifest["metadata"]["name"])
        created[key] = time.time()
        done(core.create_namespaced_pod(KUBE_NAMESPACE, manifest, _preload_content=False))

    def create_all() -> None:
        with ThreadPoolExecutor(creators, thread_name_prefix="create") as pool:
            list(pool.map(create, manifests))

    started = None  # arrival-paced: running before the first creation
    try:
        if created_first:
            create_all()
            started, cpu = time.time(), cpu_seconds()
            plane.start_scheduler()
        else:
            plane.start_scheduler()
            scheduler_ready(api)
            cpu = cpu_seconds()
            create_all()
        bound.wait_for(KUBE_NAMESPACE, pods, time.monotonic() + limit_s)
        spent = cpu_used(cpu, cpu_seconds())
        with bound.changed:
            at = {k: v for k, v in bound.at.items() if k[0] == KUBE_NAMESPACE}
            for key in at:  # the next run in this namespace counts its own pods
                del bound.at[key]
    finally:
        # Its informers would otherwise watch Gantry's pods too, on the same two cores.
        plane.stop_process("kube-scheduler")
    out = figures(created, at, started) | {"cpu_s": spent}
    log(f"kube-scheduler ({'created first' if created_first else 'arrival-paced'}): {out}")
    delete_pods(api, KUBE_NAMESPACE)  # before the next run, which takes its time at scale
    return out


# -- Gantry --------------------------------------------------------------------------------------


def gantry_setup(pods: int, flavor: str) -> tuple[Any, Any]:
    """One tenant whose quota holds every pod, its project on GANTRY_NAMESPACE."""
    from bench.daemon_setup import organisation
    from tenants.models import PriorityClass, Project

    org = organisation([("peers", None, {flavor: (pods * 1000, pods * 1000, None)})])
    team = org["peers"]
    Project.objects.filter(pk=team[2].pk).update(namespace=GANTRY_NAMESPACE)
    team[2].namespace = GANTRY_NAMESPACE
    return team, PriorityClass.objects.get(name=PRIORITY)


def run_gantry(
    api: Any,
    bound: Bound,
    pods: int,
    flavor: str,
    window: int,
    limit_s: float,
    log: Callable[[str], None],
) -> dict[str, Any]:
    from django.utils import timezone

    from bench.daemon_setup import job_rows
    from devcluster.plane import SCHEDULER_BURST, SCHEDULER_QPS
    from scheduler.backends.kubernetes.backend import KubernetesBackend
    from scheduler.backends.kubernetes.config import KubernetesConfig
    from scheduler.daemon.loop import Daemon
    from scheduler.daemon.wakeup import Waiter
    from scheduler.leader import Lease
    from scheduler.models import Job

    team, priority = gantry_setup(pods, flavor)
    # The client-side rate kube-scheduler gets on this plane, and the default calls in flight.
    config = KubernetesConfig(
        request_timeout_s=30.0, api_qps=SCHEDULER_QPS, api_burst=SCHEDULER_BURST
    )
    backend = KubernetesBackend(api, config)
    started = time.monotonic()

    phases: dict[str, float] = {}
    cycles = 0

    def on_cycle(d: Daemon) -> None:
        nonlocal cycles
        cycles += 1
        for name, ms in (d.last.phases_ms if d.last else {}).items():
            phases[name] = phases.get(name, 0.0) + ms / 1000
        waiting = Job.objects.filter(state__in=("queued", "admitted")).exists()
        if not waiting or time.monotonic() - started > limit_s:
            d.stop.set()

    # As `manage.py run_scheduler` builds it, but for the window of queued jobs per cycle.
    daemon = Daemon(
        backend,
        lease=Lease(ttl_s=60),
        interval_s=2.0,
        sync_every_s=1.0,
        max_pending=window,
        on_cycle=on_cycle,
    )
    daemon.lease.acquire()
    daemon.sync_nodes(force=True)  # the inventory is in before the first job is
    # So are a running daemon's watches and their caches (its nodes' too: the inventory sync
    # reads them): started here, and handed to its loop.
    waiter = Waiter(daemon.stop, wake=backend.watch_pods(daemon.stop))
    if backend.node_informer is not None and not backend.node_informer.wait_listed(60.0):
        log("gantry: the node watch had not listed the nodes in a minute; going on")
    specs = [
        {"team": team, "name": f"peer-{i}", "gpus": 1, "replicas": 1, "duration_s": 3600,
         "priority": priority}
        for i in range(pods)
    ]  # fmt: skip
    # Syncing thousands of nodes can outlast the lease's TTL: leading afresh now keeps the
    # first cycle from standing by, taking the lease again and syncing once more on the clock.
    if not daemon.lease.renew():
        daemon.lease.acquire()
    Job.objects.bulk_create(job_rows(specs, timezone.now()), batch_size=2000)
    began, cpu = time.time(), cpu_seconds()
    daemon.run(waiter)
    bound.wait_for(GANTRY_NAMESPACE, pods, time.monotonic() + 60)
    spent = cpu_used(cpu, cpu_seconds())
    created = {str(pk): at.timestamp() for pk, at in Job.objects.values_list("id", "created_at")}
    with bound.changed:
        at = {
            bound.job_ids[key]: value for key, value in bound.at.items()
            if key[0] == GANTRY_NAMESPACE
        }  # fmt: skip
    busiest = dict(sorted(phases.items(), key=lambda item: -item[1])[:6])
    log(f"gantry: {cycles} cycles; seconds per phase: {json.dumps(_rounded(busiest))}")
    out = figures(created, at, began) | {"cpu_s": spent}
    log(f"gantry: {out}")
    delete_pods(api, GANTRY_NAMESPACE)
    return out


def _rounded(values: dict[str, float]) -> dict[str, float]:
    return {key: round(value, 2) for key, value in values.items()}


# -- the whole run -------------------------------------------------------------------------------


def versions() -> dict[str, str]:
    from devcluster import versions as pinned

    git, commit = shutil.which("git"), "unknown"
    if git:
        with contextlib.suppress(OSError, subprocess.CalledProcessError):
            commit = subprocess.run(  # noqa: S603 - git, by its full path, fixed arguments
                [git, "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True, check=True
            ).stdout.strip()
    return {
        "kubernetes": pinned.KUBERNETES,
        "etcd": pinned.ETCD,
        "kueue": getattr(pinned, "KUEUE", "not pinned"),
        "gantry": commit,
    }


@contextlib.contextmanager
def borrowed(plane: Any) -> Iterator[Any]:
    """The running plane, lent: whoever borrows it does not stop it."""
    yield plane


def kueue_scenario(
    plane: Any, api: Any, fraction: float, database_url: str, limit_s: float, log: Any
) -> dict[str, Any]:
    """Kueue's scenario by Kueue and by Gantry, from rows and from Jobs created in Kubernetes
    (bench/k8s_kueue.py: `kueue`, `gantry`, `gantry_native`) on this same plane, once
    the throughput runs' nodes are gone: the scenario brings its own 75 nodes and a fresh
    database (`database_url`, dropped and made again)."""
    from django.db import connections
    from kubernetes import client

    from devcluster.kubelets import MANAGED_LABEL

    try:
        module = importlib.import_module("bench.k8s_kueue")
    except ImportError as error:
        return {"skipped": f"bench/k8s_kueue.py cannot be imported: {error}"}
    core: Any = client.CoreV1Api(api)
    done(
        core.delete_collection_node(label_selector=f"{MANAGED_LABEL}=true", _preload_content=False)
    )
    connections.close_all()  # the scenario drops this database and makes it again
    try:
        result: dict[str, Any] = module.run_kueue_scenario(
            lambda: borrowed(plane),
            fraction,
            native=True,  # and from batch/v1 Jobs created in Kubernetes: `gantry_native`
            database_url=database_url,
            limit_s=limit_s,
            say=log,
        )
    except Exception as error:  # the report says what failed, and the throughput stands
        return {"error": f"{type(error).__name__}: {error}"}
    return result


def run_here(
    *,
    nodes: int,
    pods: int,
    folder: Path,
    creators: int = 8,
    window: int = 20_000,
    limit_s: float = 900.0,
    node_lifecycle: bool = True,
    kueue_fraction: float | None = None,
    database_url: str = DEFAULT_URL,
    log: Callable[[str], None] = lambda line: print(line, file=sys.stderr),
) -> dict[str, Any]:
    """The benchmark on the Django database in use (a test's, or main()'s fresh one)."""
    from devcluster.kubelets import NodeShape
    from devcluster.plane import ControlPlane
    from scheduler.backends.kubernetes.inventory import flavor_from_product

    plane = ControlPlane(folder)
    plane.stop()  # a run of ours that died left it up
    shutil.rmtree(folder / "etcd", ignore_errors=True)  # and its nodes and pods
    controllers = "*" if node_lifecycle else "*,-nodelifecycle"
    plane.start(controller_manager=True, controllers=controllers)
    api = admin_client(plane.kubeconfig, creators + 4)
    try:
        apply_priority_classes(api)
        shape = NodeShape(gpus=GPUS_PER_NODE)
        began = time.monotonic()
        names = node_names(nodes)
        kubelets = register(api, names, shape, creators)
        log(f"{nodes} nodes registered in {time.monotonic() - began:.1f} s")
        rounds = [timed(kubelets.heartbeat)]
        log(f"heartbeat_s: one round of {nodes} nodes' heartbeats took {rounds[0]:.2f} s")
        with contextlib.ExitStack() as stack:
            if node_lifecycle:  # apart from the daemon, which runs in this process
                beats = stack.enter_context(apart(functools.partial(_beat, kubelets)))
            with watching(plane.kubeconfig) as bound:
                kube = run_kube_scheduler(plane, api, bound, pods, creators, limit_s, log)
                paced = run_kube_scheduler(
                    plane, api, bound, pods, creators, limit_s, log, created_first=False
                )
                flavor = flavor_from_product(shape.product)
                gantry = run_gantry(api, bound, pods, flavor, window, limit_s, log)
            if kueue_fraction is None:
                scenario: dict[str, Any] = {"skipped": "not asked for (--kueue-fraction 0)"}
            else:
                scenario = kueue_scenario(plane, api, kueue_fraction, database_url, limit_s, log)
        if node_lifecycle:
            rounds.extend(*beats)
        return {
            "throughput": {
                "gantry": gantry,
                "kube_scheduler": kube,
                "kube_scheduler_arrival_paced": paced,
            },
            "kueue_scenario": scenario,
            "heartbeat": heartbeat_figures(api, node_lifecycle, rounds),
            "nodes": nodes,
            "pods": pods,
            "versions": versions(),
        }
    finally:
        api.close()
        plane.stop()


def _beat(kubelets: Any, stop: Any) -> list[float]:
    """The nodes' heartbeat rounds until `stop`, in the process `apart` forked; each round's
    seconds."""
    kubelets.reconnect()
    rounds: list[float] = []
    kubelets.beat(stop, on_round=rounds.append)
    return rounds


def timed(step: Callable[[], None]) -> float:
    began = time.monotonic()
    step()
    return time.monotonic() - began


def heartbeat_figures(api: Any, node_lifecycle: bool, rounds: list[float]) -> dict[str, Any]:
    """How the nodes' heartbeats kept up: each round's time, and the simulated nodes that the
    node lifecycle controller found silent (Ready not True) by the end."""
    from kubernetes import client

    from devcluster.kubelets import MANAGED_LABEL

    core: Any = client.CoreV1Api(api)
    listed = done(core.list_node(label_selector=f"{MANAGED_LABEL}=true", _preload_content=False))
    not_ready = sum(
        1
        for node in listed["items"]
        if not any(
            c["type"] == "Ready" and c["status"] == "True"
            for c in (node.get("status") or {}).get("conditions") or ()
        )
    )
    return {
        "node_lifecycle": node_lifecycle,
        "rounds": len(rounds),
        "first_round_s": round(rounds[0], 2),
        "max_round_s": round(max(rounds), 2),
        "mean_round_s": round(sum(rounds) / len(rounds), 2),
        "not_ready_at_end": not_ready,
    }


def main(argv: list[str] | None = None) -> None:
    from bench.daemon_setup import fresh_database

    parser = argparse.ArgumentParser(description="Gantry beside kube-scheduler on a real plane")
    parser.add_argument("--nodes", type=int, default=5000, help="simulated nodes of 8 GPUs")
    parser.add_argument("--pods", type=int, default=10_000, help="one-GPU pods per scheduler")
    parser.add_argument("--creators", type=int, default=8, help="client threads creating pods")
    parser.add_argument(
        "--window", type=int, default=20_000, help="Gantry's queued jobs per cycle, at most"
    )
    parser.add_argument("--limit", type=float, default=900.0, help="give up after, s per peer")
    parser.add_argument("--dir", type=Path, help="control plane folder (default: a temporary one)")
    parser.add_argument(
        "--node-lifecycle",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="run the node lifecycle controller, the nodes heartbeating meanwhile (default: on)",
    )
    parser.add_argument(
        "--kueue-fraction",
        type=float,
        default=0.1,
        help="of Kueue's 15,000-workload scenario, run after the throughput (0: skip it)",
    )
    parser.add_argument("--database-url", default=DEFAULT_URL)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    if args.nodes < 1 or args.pods < 1 or args.creators < 1 or args.window < 1:
        parser.error("--nodes, --pods, --creators and --window must be 1 or more")
    if not 0 <= args.kueue_fraction <= 1:
        parser.error("--kueue-fraction must be in [0, 1]")
    if args.pods > args.nodes * GPUS_PER_NODE:
        parser.error(f"--pods must fit on the nodes ({GPUS_PER_NODE} GPUs each)")
    fresh_database(args.database_url)
    with contextlib.ExitStack() as stack:
        folder = args.dir or Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="cp-")))
        out = run_here(
            nodes=args.nodes,
            pods=args.pods,
            folder=folder,
            creators=args.creators,
            window=args.window,
            limit_s=args.limit,
            node_lifecycle=args.node_lifecycle,
            kueue_fraction=args.kueue_fraction or None,
            database_url=args.database_url,
        )
    print(json.dumps(out, indent=2))
    if args.json:
        args.json.write_text(json.dumps(out, indent=2) + "\n")


if __name__ == "__main__":
    main()
