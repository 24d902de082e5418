"""Two Kubernetes clusters (two fake API servers) and the simulated home cluster in one
installation, driven by the daemon through the FederatedBackend: jobs placed on each cluster
(their project's namespace made in that cluster at its first pod there), a gang that fits
only when one cluster is chosen whole, and a cluster that stops answering: held, lost past
its deadline, its job run elsewhere once the stale pod counts as gone, and deleted there
when the cluster answers again (nothing runs twice where Gantry can tell)."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
import yaml
from django.conf import settings

from scheduler.backends.federated import Member, federate
from scheduler.backends.federated.backend import FederatedBackend
from scheduler.backends.kubernetes.backend import KubernetesBackend
from scheduler.backends.kubernetes.config import KubernetesConfig
from scheduler.backends.retry import RetryPolicy
from scheduler.backends.simulated.cluster import SimulatedCluster
from scheduler.backends.simulated.inventory import make_nodes
from scheduler.clusters.backends import ClusterWatch
from scheduler.daemon.loop import Daemon
from scheduler.jobs.services import job_submit
from scheduler.leader import Lease
from scheduler.models import Allocation, Cluster, Job, JobState
from tenants.models import Project
from tests.conftest import Org, build_org, job_spec
from tests.daemon.conftest import FakeClock
from tests.k8s.conftest import api_client_for
from tests.k8s.fake_apiserver import FakeApiServer
from tests.k8s.real_plane import PRIORITY_CLASSES


@dataclass
class World:
    org: Org
    clock: FakeClock
    home: SimulatedCluster
    east: FakeApiServer
    west: FakeApiServer
    backend: FederatedBackend
    daemon: Daemon

    def submit(self, **overrides: Any) -> Job:
        spec = job_spec(**{"replicas": 1, "resources": {"gpus": 8}, **overrides})
        job, _ = job_submit(user=self.org.users["alice"], project=self.org.proj_alpha, payload=spec)
        return job

    def cycle(self, seconds: float = 1.0, times: int = 1) -> None:
        for _ in range(times):
            self.clock.advance(seconds)
            self.daemon.step()

    def run_pods(self, fake: FakeApiServer) -> None:
        """The fake's kubelet starts every bound pod of the project."""
        namespace = self.org.proj_alpha.namespace
        for (resource, ns, name), pod in list(fake.state.objects.items()):
            bound = resource == "pods" and ns == namespace and pod["spec"].get("nodeName")
            if bound and (pod.get("status") or {}).get("phase") != "Running":
                fake.run_container(ns, name)


def _fake(*nodes: str) -> FakeApiServer:
    fake = FakeApiServer().start()
    for doc in yaml.safe_load_all(PRIORITY_CLASSES.read_text()):
        if doc:
            fake.add_priority_class(
                doc["metadata"]["name"], doc["value"], doc.get("preemptionPolicy")
            )
    for node in nodes:
        fake.add_node(node)
    return fake


def _kubernetes(fake: FakeApiServer) -> KubernetesBackend:
    return KubernetesBackend(
        api_client_for(fake.url),
        KubernetesConfig(request_timeout_s=5.0),
        policy=RetryPolicy(attempts=2, base_s=0.0, cap_s=0.0),
        sleep=lambda _s: None,
    )


@pytest.fixture
def world(db: Any) -> Iterator[World]:
    org = build_org()
    clock = FakeClock()
    east, west = _fake("gpu-1"), _fake("gpu-1", "gpu-2")
    for name in ("east", "west"):
        Cluster.objects.create(name=name, backend="kubernetes", kubeconfig_path=f"/k/{name}")
    Cluster.objects.filter(name="east").update(lost_after_s=60)
    home = SimulatedCluster(
        make_nodes(1, "H100-80GB", 8, prefix="sim"), clock=clock, retry_sleep=lambda _s: None
    )
    backends = [_kubernetes(east), _kubernetes(west)]
    fed = federate(
        [
            Member("local", home, home=True),
            Member("east", backends[0], labels={"region": "us"}),
            Member("west", backends[1], labels={"region": "eu"}),
        ],
        clock=clock,
    )
    daemon = Daemon(fed, lease=Lease("multi", ttl_s=30), clock=clock, sleep=lambda _s: None,
                    on_cycle=ClusterWatch(fed).tick)  # fmt: skip
    yield World(org, clock, home, east, west, fed, daemon)
    for backend in backends:
        backend.api_client.close()
    east.stop()
    west.stop()


def _nodes(job: Job) -> set[str]:
    return set(
        Allocation.objects.filter(job=job, ended_at__isnull=True).values_list(
            "node__name", flat=True
        )
    )


def test_jobs_run_in_each_cluster_their_namespace_made_there(world: World) -> None:
    namespace = world.org.proj_alpha.namespace
    east = world.submit(placement={"clusters": ["east"]})
    west = world.submit(placement={"clusters": ["west"]})
    home = world.submit(placement={"clusters": ["local"]})
    world.cycle()
    assert (_nodes(east), _nodes(west), _nodes(home)) == (
        {"east:gpu-1"},
        {"west:gpu-1"},
        {"sim-0000"},
    )
    assert world.east.get("namespaces", "", namespace) is not None
    assert world.west.get("namespaces", "", namespace) is not None
    assert (
        world.east.get("pods", namespace, f"gantry-{east.pk}-a0-r0")["spec"]["nodeName"] == "gpu-1"
    )
    assert world.east.get("pods", namespace, f"gantry-{west.pk}-a0-r0") is None
    assert (
        world.west.get("pods", namespace, f"gantry-{west.pk}-a0-r0")["spec"]["nodeName"] == "gpu-1"
    )
    world.run_pods(world.east)
    world.run_pods(world.west)
    world.cycle(times=2)
    for job in (east, west):
        job.refresh_from_db()
        assert job.state == JobState.RUNNING, job.reason


def test_a_gang_that_fits_only_in_one_cluster_whole_runs_there(world: World) -> None:
    # 2 x 8 GPUs: east (8) and home (8) each hold half; only west (2 x 8) holds it whole.
    gang = world.submit(replicas=2)
    world.cycle()
    assert _nodes(gang) == {"west:gpu-1", "west:gpu-2"}


def test_a_silent_cluster_is_held_then_lost_and_its_job_runs_elsewhere_once(world: World) -> None:
    namespace = world.org.proj_alpha.namespace
    job = world.submit(
        placement={"preferred_clusters": ["east"]}, retry={"limit": 2, "backoff_s": 0}
    )
    world.cycle()
    world.run_pods(world.east)
    world.cycle(times=2)
    assert _nodes(job) == {"east:gpu-1"}
    world.east.inject("reset", count=1_000_000)  # east stops answering
    world.cycle(seconds=20, times=3)  # 60 s: within its deadline, held
    job.refresh_from_db()
    assert (job.state, job.attempt, _nodes(job)) == (JobState.RUNNING, 0, {"east:gpu-1"})
    world.cycle(seconds=20, times=3)  # past it: lost; the attempt failed, the retry fenced
    job.refresh_from_db()
    assert Cluster.objects.get(name="east").state == "lost"
    assert (job.state, job.attempt) == (JobState.QUEUED, 1)
    world.cycle(seconds=settings.GANTRY_NODE_LOST_GRACE_S / 2, times=3)
    job.refresh_from_db()
    assert job.attempt == 1 and _nodes(job) <= {"west:gpu-1", "west:gpu-2", "sim-0000"}
    assert _nodes(job), job.reason
    # east answers again: active, and the stale attempt's pod there is deleted
    world.east.faults.clear()
    world.cycle(seconds=11, times=3)
    assert Cluster.objects.get(name="east").state == "active"
    stale = world.east.get("pods", namespace, f"gantry-{job.pk}-a0-r0")
    assert stale is None or stale["metadata"].get("deletionTimestamp"), stale


def test_every_projects_namespace_is_made_in_each_kubernetes_cluster_before_any_pod(
    world: World,
) -> None:
    """Users create workloads in their project's namespace in the cluster of their choice:
    the daemon's node sync makes it in each Kubernetes member ahead of any job there."""
    world.cycle()
    projects = list(Project.objects.values_list("namespace", flat=True))
    assert projects
    for fake in (world.east, world.west):
        for namespace in projects:
            made = fake.get("namespaces", "", namespace)
            assert made is not None, namespace
            assert made["metadata"]["labels"]["app.kubernetes.io/managed-by"] == "gantry"
    assert not Job.objects.exists()
