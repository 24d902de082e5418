"""Fixtures: the fake apiserver, a real client pointed at it, and the backend over both.

`cluster` is the contract fixture: the fake, and the real control plane (`real_plane`, see
tests/k8s/real_plane.py: KUBECONFIG's cluster, else a devcluster plane started for the session).
Tests that inject faults take `fake` and run against the fake only.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
from kubernetes import client

from scheduler.backends.kubernetes import KubernetesBackend
from scheduler.backends.kubernetes_config import KubernetesConfig
from scheduler.backends.kubernetes_retry import RetryPolicy
from tests.k8s.fake_apiserver import FakeApiServer
from tests.k8s.real_plane import RealPlane, admin_client, real_plane, wait_for_pod

__all__ = ["real_plane"]  # the session fixture, for the tests of this folder

NAMESPACE = "team-a"
# A project namespace as Gantry creates it: its own label, restricted Pod Security.
RESTRICTED = {
    "pod-security.kubernetes.io/enforce": "restricted",
    "app.kubernetes.io/managed-by": "gantry",
}


@dataclass
class Sleeps:
    """Stands in for time.sleep: records the delays, never waits."""

    delays: list[float] = field(default_factory=list)

    def __call__(self, seconds: float) -> None:
        self.delays.append(seconds)


@pytest.fixture
def sleeps() -> Sleeps:
    return Sleeps()


@pytest.fixture
def fake() -> Iterator[FakeApiServer]:
    server = FakeApiServer().start()
    server.add_namespace(NAMESPACE, RESTRICTED)
    server.add_node("gpu-1")
    server.add_node("gpu-2")
    yield server
    server.stop()


def api_client_for(url: str) -> client.ApiClient:
    configuration = client.Configuration(host=url)
    configuration.retries = False  # the backend retries, with backoff and jitter
    return client.ApiClient(configuration)


@pytest.fixture
def backend(fake: FakeApiServer, sleeps: Sleeps) -> Iterator[KubernetesBackend]:
    api = api_client_for(fake.url)
    config = KubernetesConfig(request_timeout_s=5.0)  # generous: CI machines are busy
    policy = RetryPolicy(attempts=3, base_s=0.1, cap_s=2.0)
    yield KubernetesBackend(api, config, policy=policy, sleep=sleeps, rand=lambda: 0.5)
    api.close()


@dataclass
class Cluster:
    """What a contract test may do on either cluster."""

    backend: KubernetesBackend
    namespace: str
    nodes: list[str]  # schedulable node names (at least one)
    finish_deletion: Callable[[str, str], None]  # wait until the pod object is gone
    real: bool


@pytest.fixture(params=["fake", pytest.param("real", marks=pytest.mark.kubernetes)])
def cluster(request: pytest.FixtureRequest) -> Iterator[Cluster]:
    if request.param == "fake":
        yield from _fake_cluster(request.getfixturevalue("fake"))
    else:
        yield from _real_cluster(request.getfixturevalue("real_plane"))


def _fake_cluster(fake: FakeApiServer) -> Iterator[Cluster]:
    api = api_client_for(fake.url)
    backend = KubernetesBackend(api, KubernetesConfig(request_timeout_s=2.0))
    yield Cluster(backend, NAMESPACE, ["gpu-1", "gpu-2"], fake.finalize_pod, real=False)
    api.close()


def _real_cluster(plane: RealPlane) -> Iterator[Cluster]:
    if not plane.nodes:
        pytest.fail(f"the cluster of {plane.kubeconfig} has no ready, schedulable node")
    api = admin_client(plane.kubeconfig)
    backend = KubernetesBackend(api, KubernetesConfig(request_timeout_s=10.0))
    namespace = f"gantry-contract-{uuid.uuid4().hex[:8]}"
    backend.ensure_namespace(namespace)

    def finish_deletion(ns: str, name: str) -> None:
        """A real kubelet (here the simulator) confirms the deletion; wait until it has."""
        wait_for_pod(api, ns, name, lambda pod: pod is None)

    yield Cluster(backend, namespace, plane.nodes, finish_deletion, real=True)
    core: Any = client.CoreV1Api(api)  # raw response: no model for what delete returns
    core.delete_namespace(namespace, _preload_content=False).release_conn()
    api.close()
