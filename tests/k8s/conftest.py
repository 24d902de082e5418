"""Fixtures: the fake apiserver, a real client pointed at it, and the backend over both.

`cluster` is the contract fixture: the fake always, and a real cluster as well when KUBECONFIG
is set (docs/kubernetes.md). Tests that play the kubelet or inject faults take `fake` and run
against the fake only.
"""

from __future__ import annotations

import os
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
from kubernetes import client

from scheduler.backends.kubernetes import KubernetesBackend, api_client_from_environment
from scheduler.backends.kubernetes_config import KubernetesConfig
from scheduler.backends.kubernetes_retry import RetryPolicy
from tests.k8s.fake_apiserver import FakeApiServer

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


@pytest.fixture(params=["fake", "real"])
def cluster(request: pytest.FixtureRequest) -> Iterator[Cluster]:
    if request.param == "fake":
        yield from _fake_cluster(request.getfixturevalue("fake"))
    else:
        yield from _real_cluster()


def _fake_cluster(fake: FakeApiServer) -> Iterator[Cluster]:
    api = api_client_for(fake.url)
    backend = KubernetesBackend(api, KubernetesConfig(request_timeout_s=2.0))
    yield Cluster(backend, NAMESPACE, ["gpu-1", "gpu-2"], fake.finalize_pod, real=False)
    api.close()


def _real_cluster() -> Iterator[Cluster]:
    if not os.environ.get("KUBECONFIG"):
        pytest.skip("real-cluster contract run: set KUBECONFIG (docs/kubernetes.md)")
    api = api_client_from_environment()
    backend = KubernetesBackend(api, KubernetesConfig(request_timeout_s=10.0))
    namespace = f"gantry-contract-{uuid.uuid4().hex[:8]}"
    backend.ensure_namespace(namespace)
    nodes = [n.name for n in backend.list_nodes() if n.ready and not n.unschedulable]
    if not nodes:
        pytest.skip("the cluster has no ready, schedulable node")

    def finish_deletion(ns: str, name: str) -> None:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            if not any(p.name == name for p in backend.list_pods() if p.namespace == ns):
                return
            time.sleep(1)
        raise AssertionError(f"{ns}/{name} still exists after 120 s")

    yield Cluster(backend, namespace, nodes, finish_deletion, real=True)
    core: Any = client.CoreV1Api(api)  # raw response: no model for what delete returns
    core.delete_namespace(namespace, _preload_content=False).release_conn()
    api.close()
