"""Fixtures: the fake apiserver, a real client pointed at it, and the backend over both.

`cluster` is the contract fixture: the fake, and the real control plane (`real_plane`, see
tests/k8s/real_plane.py: KUBECONFIG's cluster, else a devcluster plane started for the session).
Tests that inject faults take `fake` and run against the fake only.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, Protocol

import pytest
import yaml
from kubernetes import client

from devcluster.kubelets import Kubelets, NodeShape
from scheduler.backends.kubernetes.backend import KubernetesBackend
from scheduler.backends.kubernetes.config import KubernetesConfig
from scheduler.backends.retry import RetryPolicy
from tests.k8s.fake_apiserver import FakeApiServer
from tests.k8s.real_plane import (
    PRIORITY_CLASSES,
    WAIT_S,
    RealPlane,
    admin_client,
    drained,
    wait_for,
    wait_for_pod,
)

NAMESPACE = "team-a"
PAUSE = "registry.k8s.io/pause:3.10"
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


def started_fake(*nodes: str) -> FakeApiServer:
    """A started fake API server with Gantry's PriorityClasses (as a real cluster has them,
    from platform/k8s) and 8-GPU `nodes`; the caller stops it."""
    server = FakeApiServer().start()
    for doc in yaml.safe_load_all(PRIORITY_CLASSES.read_text()):
        if doc:
            server.add_priority_class(
                doc["metadata"]["name"], doc["value"], doc.get("preemptionPolicy")
            )
    for name in nodes:
        server.add_node(name)
    return server


@pytest.fixture
def fake() -> Iterator[FakeApiServer]:
    server = started_fake()
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
    # Generous: CI machines are busy. The two-call path (create unbound, then bind), whose
    # faults these tests play; pods created already bound: test_contract_bound.py.
    config = KubernetesConfig(request_timeout_s=5.0, create_bound=False)
    policy = RetryPolicy(attempts=3, base_s=0.1, cap_s=2.0)
    yield KubernetesBackend(api, config, policy=policy, sleep=sleeps, rand=lambda: 0.5)
    api.close()


class Kubelet(Protocol):
    """The nodes' side of a contract test: the fake is told what its kubelet does, at once;
    the real plane's simulated kubelets (devcluster.kubelets) act on their own, and are
    waited for."""

    def fail_pull(self, namespace: str, name: str) -> None:
        """Before the bind: the pod's image will not pull (ImagePullBackOff)."""

    def start(self, namespace: str, name: str) -> None:
        """After the bind: the kubelet took the pod (Running, or waiting to pull)."""

    def succeed(self, namespace: str, name: str) -> None:
        """The container exits 0: Succeeded."""

    def keep_terminating(self, namespace: str, name: str) -> None:
        """Before a delete: the containers take their time to stop."""

    def look_again(self) -> None:
        """The kubelets have had their chance to act (two more passes on the real plane)."""

    def stopped(self, namespace: str, name: str) -> None:
        """The containers stopped: the kubelet confirms the deletion; returns once it did."""

    def add_node(self) -> str:
        """A new Ready CPU node of our own (removed after the test)."""

    def lose_node(self, name: str) -> None:
        """The node stops answering: NotReady, nothing on it finishes."""


@dataclass
class FakeKubelet:
    fake: FakeApiServer
    pulls_failing: set[tuple[str, str]] = field(default_factory=set)

    def fail_pull(self, namespace: str, name: str) -> None:
        self.pulls_failing.add((namespace, name))

    def start(self, namespace: str, name: str) -> None:
        if (namespace, name) in self.pulls_failing:
            message = f'Back-off pulling image "{PAUSE}"'
            self.fake.stay_pending(namespace, name, "ImagePullBackOff", message)
        else:
            self.fake.run_container(namespace, name)

    def succeed(self, namespace: str, name: str) -> None:
        terminated = {"terminated": {"exitCode": 0, "reason": "Completed"}}
        self.fake.set_pod_status(
            namespace,
            name,
            {"phase": "Succeeded", "containerStatuses": [{"name": "main", "state": terminated}]},
        )

    def keep_terminating(self, namespace: str, name: str) -> None:
        pass  # the fake's kubelet confirms nothing until told

    def look_again(self) -> None:
        pass

    def stopped(self, namespace: str, name: str) -> None:
        self.fake.finalize_pod(namespace, name)

    def add_node(self) -> str:
        name = f"node-{uuid.uuid4().hex[:8]}"
        self.fake.add_node(name, gpus=0, cpu="8", memory="32Gi")
        return name

    def lose_node(self, name: str) -> None:
        def not_ready(node: dict[str, Any]) -> None:
            node["status"]["conditions"] = [{"type": "Ready", "status": "Unknown"}]

        self.fake.mutate("nodes", "", name, not_ready)


@dataclass
class RealKubelet:
    api: client.ApiClient
    kubelets: Kubelets
    added: list[str] = field(default_factory=list)

    def fail_pull(self, namespace: str, name: str) -> None:
        self.kubelets.hold_pending(namespace, name)

    def start(self, namespace: str, name: str) -> None:
        def took(pod: dict[str, Any] | None) -> bool:
            status = (pod or {}).get("status") or {}
            return status.get("phase") != "Pending" or bool(status.get("containerStatuses"))

        wait_for_pod(self.api, namespace, name, took)

    def succeed(self, namespace: str, name: str) -> None:
        self.kubelets.succeed(namespace, name)
        wait_for_pod(self.api, namespace, name, lambda p: _phase(p) == "Succeeded")

    def keep_terminating(self, namespace: str, name: str) -> None:
        self.kubelets.keep_terminating(namespace, name)

    def look_again(self) -> None:
        assert self.kubelets.wait_passes(2, WAIT_S), "the simulated kubelets stopped"

    def stopped(self, namespace: str, name: str) -> None:
        self.kubelets.stopped(namespace, name)
        wait_for_pod(self.api, namespace, name, lambda pod: pod is None)

    def add_node(self) -> str:
        name = f"node-{uuid.uuid4().hex[:8]}"
        self.kubelets.add_nodes([name], NodeShape(gpus=0, cpu="8", memory="32Gi"))
        self.added.append(name)
        return name

    def lose_node(self, name: str) -> None:
        self.kubelets.lose_node(name)

    def remove_added_nodes(self) -> None:
        core: Any = client.CoreV1Api(self.api)
        for name in self.added:
            self.kubelets.nodes.discard(name)
            drained(core.delete_node(name, _preload_content=False))


def _none(obj: dict[str, Any] | None) -> bool:
    return obj is None


def _present(obj: dict[str, Any] | None) -> bool:
    return obj is not None


def _phase(pod: dict[str, Any] | None) -> str | None:
    return ((pod or {}).get("status") or {}).get("phase")


@dataclass
class Cluster:
    """What a contract test may do on either cluster."""

    backend: KubernetesBackend
    namespace: str
    nodes: list[str]  # schedulable node names (at least one)
    finish_deletion: Callable[[str, str], None]  # wait until the pod object is gone
    real: bool
    # None on KUBECONFIG's cluster: its nodes are not ours to play, its server not ours to
    # compact or restart (the tests that need them skip there; CI runs devcluster's plane).
    kubelet_: Kubelet | None = None
    compact_: Callable[[], object] | None = None  # the store forgets history
    restart_: Callable[[], None] | None = None  # open watches break, the watch cache restarts
    # (kind, namespace, name): returns once the object is gone (the fake's garbage collector
    # works at once, the real one in the controller manager, a moment later).
    gone: Callable[[str, str, str], None] = lambda kind, ns, name: None

    @property
    def kubelet(self) -> Kubelet:
        if self.kubelet_ is None:
            pytest.skip("KUBECONFIG's cluster: its kubelets are real, not played by the test")
        return self.kubelet_

    def compact(self) -> None:
        if self.compact_ is None:
            pytest.skip("KUBECONFIG's cluster: not ours to compact")
        self.compact_()

    def restart_apiserver(self) -> None:
        if self.restart_ is None:
            pytest.skip("KUBECONFIG's cluster: not ours to restart")
        self.restart_()


@pytest.fixture(params=["fake", pytest.param("real", marks=pytest.mark.kubernetes)])
def cluster(request: pytest.FixtureRequest) -> Iterator[Cluster]:
    if request.param == "fake":
        yield from _fake_cluster(request.getfixturevalue("fake"))
    else:
        yield from _real_cluster(request.getfixturevalue("real_plane"))


def _fake_cluster(fake: FakeApiServer) -> Iterator[Cluster]:
    api = api_client_for(fake.url)
    # The contract of the two-call path (create unbound, then bind through pods/binding);
    # pods created already bound have tests of their own (test_contract_bound.py).
    backend = KubernetesBackend(api, KubernetesConfig(request_timeout_s=2.0, create_bound=False))

    yield Cluster(
        backend,
        NAMESPACE,
        ["gpu-1", "gpu-2"],
        fake.finalize_pod,
        real=False,
        kubelet_=FakeKubelet(fake),
        compact_=fake.compact,
        restart_=fake.restart,
        gone=lambda kind, ns, name: _absent(fake.get(kind, ns, name)),
    )
    api.close()


def _absent(obj: dict[str, Any] | None) -> None:
    assert obj is None, f"still there: {obj}"


def _real_cluster(plane: RealPlane) -> Iterator[Cluster]:
    if not plane.nodes:
        pytest.fail(f"the cluster of {plane.kubeconfig} has no ready, schedulable node")
    api = admin_client(plane.kubeconfig)
    backend = KubernetesBackend(api, KubernetesConfig(request_timeout_s=10.0, create_bound=False))
    namespace = f"gantry-contract-{uuid.uuid4().hex[:8]}"
    backend.ensure_namespace(namespace)
    # Admission refuses pods until the controller manager made the namespace's service account;
    # a test that restarts the API server at once would leave it unmade for a while longer.
    core: Any = client.CoreV1Api(api)  # raw responses: no models
    wait_for(core.list_namespaced_service_account, namespace, "default", _present)

    def finish_deletion(ns: str, name: str) -> None:
        """A real kubelet (here the simulator) confirms the deletion; wait until it has."""
        wait_for_pod(api, ns, name, lambda pod: pod is None)

    def gone(kind: str, ns: str, name: str) -> None:
        wait_for(getattr(core, f"list_namespaced_{kind.removesuffix('s')}"), ns, name, _none)

    kubelet = RealKubelet(api, plane.kubelets) if plane.kubelets is not None else None
    cp = plane.plane
    yield Cluster(
        backend,
        namespace,
        plane.nodes,
        finish_deletion,
        real=True,
        kubelet_=kubelet,
        compact_=cp.compact if cp is not None else None,
        restart_=cp.restart_apiserver if cp is not None else None,
        gone=gone,
    )
    if kubelet is not None:
        kubelet.remove_added_nodes()
    # A pod left Terminating (a lost node's) would hold the namespace's deletion forever.
    everything = {"gracePeriodSeconds": 0}
    drained(
        core.delete_collection_namespaced_pod(namespace, body=everything, _preload_content=False)
    )
    drained(core.delete_namespace(namespace, _preload_content=False))
    api.close()
