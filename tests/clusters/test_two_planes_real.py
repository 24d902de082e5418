"""Two real control planes (devcluster: etcd and kube-apiserver each, their nodes played by
`devcluster.kubelets`) and the simulated home cluster in one installation, driven by the daemon
through the FederatedBackend that the Cluster rows' kubeconfigs make (issue 38).

Jobs are placed on each cluster; a gang that fits only when one cluster is chosen whole lands
there whole; a plane whose API server is killed holds its job charged until its deadline, the
job is then retried on the other plane, and when the API server is started again its stale pod
is deleted: read from both API servers, the job runs once. The daemon runs on an injected
clock (deadlines pass at once); the planes and their kubelets on real time, waited for with a
deadline. A tenant's quota pinned to a cluster keeps its job off that plane.
"""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import pytest
from django.conf import settings
from kubernetes import client

from devcluster.kubelets import Kubelets, NodeShape
from devcluster.plane import ControlPlane
from scheduler.backends.federated import Member, federate
from scheduler.backends.federated.backend import FederatedBackend
from scheduler.backends.simulated.cluster import SimulatedCluster
from scheduler.backends.simulated.inventory import make_nodes
from scheduler.clusters.backends import ClusterWatch, last_known, member_backend
from scheduler.daemon.loop import Daemon
from scheduler.jobs.services import job_submit
from scheduler.leader import Lease
from scheduler.models import Allocation, Cluster, Job, JobState
from tenants import services
from tenants.quotas.rules import QuotaValues
from tests.conftest import Org, build_org, job_spec
from tests.daemon.conftest import FakeClock
from tests.k8s.real_plane import admin_client, apply_priority_classes, require_binaries

pytestmark = [
    pytest.mark.kubernetes,
    # A kept-alive connection that the killed API server reset is left to the garbage
    # collector by http.client (its response's file still refers to the socket): a
    # ResourceWarning when collected, whichever client held it. Nothing else is ignored.
    pytest.mark.filterwarnings(
        "ignore:Exception ignored in. <ssl.SSLSocket:pytest.PytestUnraisableExceptionWarning"
    ),
]

DEADLINE_S = 30.0  # for a real server and its kubelets on a loaded machine
NODES = {"east": ("gpu-1",), "west": ("gpu-1", "gpu-2")}
EAST_LOST_AFTER_S = 60


@dataclass
class Plane:
    """One cluster's control plane, its admin client and the kubelets playing its nodes."""

    name: str
    plane: ControlPlane
    api: client.ApiClient
    kubelets: Kubelets

    @property
    def core(self) -> Any:
        return client.CoreV1Api(self.api)

    def pods(self, namespace: str) -> dict[str, dict[str, Any]]:
        """The namespace's pods by name, as this API server has them."""
        response = self.core.list_namespaced_pod(namespace, _preload_content=False)
        try:
            return {p["metadata"]["name"]: p for p in json.loads(response.data)["items"]}
        finally:
            response.release_conn()

    def kill_apiserver(self) -> None:
        """SIGKILL, as a crashed host: nothing is flushed, no watch is closed politely."""
        assert self.plane.state is not None
        os.kill(self.plane.state.pids["kube-apiserver"], signal.SIGKILL)

    def apiserver_up(self) -> bool:
        assert self.plane.state is not None
        pid = self.plane.state.pids.get("kube-apiserver")
        try:
            with self.plane.request("/readyz", timeout=2) as answer:
                return pid is not None and answer.status == 200
        except OSError:
            return False


@pytest.fixture(scope="module")
def planes(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Plane]]:
    """Both planes for the module (each test's pods are deleted after it). Only the service
    account controller runs beside each API server: a namespace's pods need its default
    account, and the node lifecycle controller would only add load."""
    require_binaries()
    started: dict[str, Plane] = {}
    stop = threading.Event()
    threads: list[threading.Thread] = []
    made = {name: ControlPlane(tmp_path_factory.mktemp(f"plane-{name}")) for name in NODES}
    try:
        with ThreadPoolExecutor(len(made)) as pool:  # each waits for its own servers
            for future in [
                pool.submit(p.start, controller_manager=True, controllers="serviceaccount")
                for p in made.values()
            ]:
                future.result()
        for name, nodes in NODES.items():
            plane = made[name]
            api = admin_client(plane.kubeconfig)
            apply_priority_classes(api)
            kubelets = Kubelets(api)
            kubelets.add_nodes(nodes, NodeShape(gpus=8))
            started[name] = Plane(name, plane, api, kubelets)
            thread = threading.Thread(
                target=kubelets.run, args=(stop, 0.1), name=f"kubelets-{name}", daemon=True
            )
            thread.start()
            threads.append(thread)
        yield started
    finally:
        stop.set()
        for thread in threads:
            thread.join(timeout=15)
        for each in started.values():
            each.api.close()
        for plane in made.values():
            plane.stop()


@dataclass
class World:
    org: Org
    clock: FakeClock
    planes: dict[str, Plane]
    backend: FederatedBackend
    daemon: Daemon

    @property
    def namespace(self) -> str:
        return self.org.proj_alpha.namespace

    def submit(self, **overrides: Any) -> Job:
        spec = job_spec(**{"replicas": 1, "resources": {"gpus": 8}, **overrides})
        job, _ = job_submit(user=self.org.users["alice"], project=self.org.proj_alpha, payload=spec)
        return job

    def cycle(self, seconds: float = 1.0, times: int = 1) -> None:
        for _ in range(times):
            self.clock.advance(seconds)
            self.daemon.step()

    def until(self, what: str, done: Callable[[], bool], seconds: float = 1.0) -> None:
        """Cycle (the kubelets act on their own meanwhile) until `done()`, within DEADLINE_S."""
        deadline = time.monotonic() + DEADLINE_S
        while not done():
            if time.monotonic() > deadline:
                raise AssertionError(f"not reached within {DEADLINE_S} s: {what}")
            time.sleep(0.1)
            self.cycle(seconds)

    def running(self, job: Job, *names: str) -> dict[str, list[str]]:
        """Per plane (those named, else all), the job's pods its API server has Running and
        not being deleted."""
        out: dict[str, list[str]] = {}
        for name in names or self.planes:
            out[name] = sorted(
                pod_name
                for pod_name, pod in self.planes[name].pods(self.namespace).items()
                if pod_name.startswith(f"gantry-{job.pk}-")
                and (pod.get("status") or {}).get("phase") == "Running"
                and not pod["metadata"].get("deletionTimestamp")
            )
        return out


@pytest.fixture
def world(db: Any, planes: dict[str, Plane]) -> Iterator[World]:
    org = build_org()
    clock = FakeClock()
    for name, each in planes.items():
        Cluster.objects.create(
            name=name,
            backend="kubernetes",
            kubeconfig_path=str(each.plane.kubeconfig),
            labels={"region": "us" if name == "east" else "eu"},
        )
    Cluster.objects.filter(name="east").update(lost_after_s=EAST_LOST_AFTER_S)
    home_backend = SimulatedCluster(
        make_nodes(1, "H100-80GB", 8, prefix="sim"), clock=clock, retry_sleep=lambda _s: None
    )
    # As `backend_for_clusters` builds it from the rows (each Kubernetes member from its row's
    # kubeconfig), on the test's clock.
    clusters = list(Cluster.objects.order_by("name"))
    members = [
        Member(c.name, member_backend(c, home_backend), home=c.home, labels=dict(c.labels))
        for c in clusters
    ]
    home = next(c.name for c in clusters if c.home)
    fed = federate(members, seed=last_known(clusters, home), clock=clock)
    daemon = Daemon(fed, lease=Lease("two-planes", ttl_s=30), clock=clock,
                    sleep=lambda _s: None, on_cycle=ClusterWatch(fed).tick)  # fmt: skip
    yield World(org, clock, planes, fed, daemon)
    for member in members:
        api = getattr(member.backend, "api_client", None)
        if api is not None:
            api.close()
    for each in planes.values():  # the next test starts on empty nodes
        if each.apiserver_up():
            each.core.delete_collection_namespaced_pod(
                org.proj_alpha.namespace, grace_period_seconds=0
            )


def _nodes(job: Job) -> set[str]:
    return set(
        Allocation.objects.filter(job=job, ended_at__isnull=True).values_list(
            "node__name", flat=True
        )
    )


def _state(job: Job) -> tuple[str, int]:
    job.refresh_from_db()
    return job.state, job.attempt


def test_jobs_run_on_each_plane_and_the_simulated_cluster(world: World) -> None:
    east = world.submit(placement={"clusters": ["east"]})
    west = world.submit(placement={"clusters": ["west"]})
    home = world.submit(placement={"clusters": ["local"]})
    world.cycle()
    assert (_nodes(east), _nodes(west), _nodes(home)) == (
        {"east:gpu-1"},
        {"west:gpu-1"},
        {"sim-0000"},
    )
    world.until(
        "both planes' jobs running",
        lambda: all(_state(j)[0] == JobState.RUNNING for j in (east, west)),
    )
    # Each API server has its own job's pod, bound to its own node name, and not the other's.
    assert world.running(east) == {"east": [f"gantry-{east.pk}-a0-r0"], "west": []}
    assert world.running(west) == {"east": [], "west": [f"gantry-{west.pk}-a0-r0"]}
    pod = world.planes["west"].pods(world.namespace)[f"gantry-{west.pk}-a0-r0"]
    assert pod["spec"]["nodeName"] == "gpu-1"


def test_a_gang_that_fits_only_in_one_cluster_whole_runs_there_whole(world: World) -> None:
    # 2 x 8 GPUs: east (one node of 8) and home (one of 8) each hold half; only west holds it.
    gang = world.submit(replicas=2)
    world.cycle()
    assert _nodes(gang) == {"west:gpu-1", "west:gpu-2"}
    world.until("the gang running", lambda: _state(gang)[0] == JobState.RUNNING)
    assert world.running(gang) == {
        "east": [],
        "west": [f"gantry-{gang.pk}-a0-r0", f"gantry-{gang.pk}-a0-r1"],
    }


def test_a_pinned_limit_keeps_the_tenants_job_off_that_plane(world: World) -> None:
    # alpha may use no H100 on east (a pinned limit of 0): its job that prefers east, and
    # would land there without the pin (the next test), runs on west.
    services.quota_set(
        user=world.org.users["pat"],
        tenant=world.org.alpha,
        flavor=world.org.h100,
        values=QuotaValues(0, 0, None, 1.0),
        cluster=Cluster.objects.get(name="east"),
    )
    job = world.submit(placement={"clusters": ["east", "west"], "preferred_clusters": ["east"]})
    world.cycle()
    assert _nodes(job) == {"west:gpu-1"}, job.reason
    world.until("running on west", lambda: _state(job)[0] == JobState.RUNNING)
    assert world.running(job) == {"east": [], "west": [f"gantry-{job.pk}-a0-r0"]}


def test_a_killed_plane_holds_its_job_until_the_deadline_then_it_runs_once_elsewhere(
    world: World,
) -> None:
    east = world.planes["east"]
    job = world.submit(
        placement={"clusters": ["east", "west"], "preferred_clusters": ["east"]},
        retry={"limit": 2, "backoff_s": 0},
    )
    world.cycle()
    assert _nodes(job) == {"east:gpu-1"}
    world.until("running on east", lambda: _state(job) == (JobState.RUNNING, 0))
    stale = f"gantry-{job.pk}-a0-r0"
    try:
        # 1. east's API server is killed: within its deadline the job stays charged and held.
        east.kill_apiserver()
        world.cycle(seconds=20, times=3)  # 60 s on the daemon's clock: not past 60 s
        assert _state(job) == (JobState.RUNNING, 0)
        assert _nodes(job) == {"east:gpu-1"}
        assert Allocation.objects.filter(job=job, ended_at__isnull=True).exists()  # charged
        # 2. Past it: lost; the attempt fails and the retry waits for the node's grace.
        world.cycle(seconds=20, times=3)
        assert Cluster.objects.get(name="east").state == "lost"
        assert _state(job) == (JobState.QUEUED, 1)
        assert world.running(job, "west") == {"west": []}
        # 3. The grace over, the retry runs on west: never on the silent plane.
        world.cycle(seconds=settings.GANTRY_NODE_LOST_GRACE_S / 2, times=3)
        assert len(_nodes(job)) == 1 and _nodes(job) <= {"west:gpu-1", "west:gpu-2"}
        world.until("the retry running", lambda: _state(job) == (JobState.RUNNING, 1))
        # 4. east's API server starts again on its port: the cluster answers, is active, and
        # the stale attempt's pod, which no allocation holds, is deleted there.
        east.plane.restart_apiserver()
        world.clock.advance(11)  # past the federation's quiet time for a silent member
        world.until(
            "the stale pod gone from east",
            lambda: stale not in east.pods(world.namespace),
        )
        assert Cluster.objects.get(name="east").state == "active"
    finally:
        if not east.apiserver_up():
            east.plane.restart_apiserver()
    # Read from both API servers: the job runs once, as its attempt 1, where Gantry put it.
    running = world.running(job)
    assert running == {"east": [], "west": [f"gantry-{job.pk}-a1-r0"]}
    assert _state(job) == (JobState.RUNNING, 1)
