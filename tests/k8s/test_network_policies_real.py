"""NetworkPolicies of project namespaces and of gantry-system, on a real API server (issue 34).

A project namespace is made through Gantry's own path (KubernetesBackend.ensure_namespace, as the
daemon makes one for a project's first pod); platform/k8s/05-network-policies.yaml is applied as
`kubectl apply --server-side` would. The policies are then read back as the server stores them
(defaults filled in) and judged by the rules of NetworkPolicy (tests/k8s/netpol.py) against a
cluster of pods drawn on paper: tenants, Gantry's web, metrics and databases, DNS, the ingress
controller, Prometheus, and addresses outside (the metadata address, the internet).

The test cluster runs no CNI, so nothing here enforces the policies; what is proven is that the
objects exist and select what they should. Enforcement is the CNI's (docs/kubernetes.md).
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from scheduler.backends.kubernetes.backend import KubernetesBackend
from scheduler.backends.kubernetes.config import KubernetesConfig
from scheduler.backends.retry import RetryPolicy
from tests.k8s.netpol import Pod, connects, ingress_allows
from tests.k8s.real_api import Paths, apply, manifests, request
from tests.k8s.real_plane import RealPlane

pytestmark = pytest.mark.kubernetes

SYSTEM = "gantry-system"
PROJECT_POLICIES = {"gantry-default-deny", "gantry-same-namespace", "gantry-dns", "gantry-egress"}
SYSTEM_POLICIES = {
    "gantry-default-deny-ingress",
    "gantry-web",
    "gantry-metrics",
    "gantry-datastores",
}


def _policies(real_plane: RealPlane, namespace: str) -> list[dict[str, Any]]:
    path = f"/apis/networking.k8s.io/v1/namespaces/{namespace}/networkpolicies"
    answer = request(real_plane.api, "GET", path)
    assert answer.status == 200, answer
    items: list[dict[str, Any]] = answer.body["items"]
    return items


@pytest.fixture(scope="module")
def stored(real_plane: RealPlane) -> Iterator[tuple[str, str, list[dict[str, Any]]]]:
    """Two projects' namespaces made by the backend, gantry-system's policies applied; every
    policy as the server stores it."""
    backend = KubernetesBackend(
        real_plane.api, KubernetesConfig(request_timeout_s=10.0), policy=RetryPolicy(attempts=1)
    )
    first, second = (f"gantry-np-{uuid.uuid4().hex[:8]}" for _ in range(2))
    backend.ensure_namespace(first)
    backend.ensure_namespace(second)
    paths = Paths(real_plane.api)
    applied = manifests("00-namespace.yaml", "05-network-policies.yaml")
    for manifest in applied:
        answer = apply(real_plane.api, paths, manifest.doc)
        assert answer.status in (200, 201), f"{manifest.id}: {answer.message}"
    policies = [p for ns in (first, second, SYSTEM) for p in _policies(real_plane, ns)]
    yield first, second, policies
    for manifest in applied:
        if manifest.doc["kind"] == "NetworkPolicy":
            request(real_plane.api, "DELETE", paths.of(manifest.doc))
    for namespace in (first, second):
        request(real_plane.api, "DELETE", f"/api/v1/namespaces/{namespace}")


def test_each_project_namespace_and_gantry_system_hold_their_policies(
    stored: tuple[str, str, list[dict[str, Any]]],
) -> None:
    first, second, policies = stored
    names: dict[str, set[str]] = {}
    for policy in policies:
        names.setdefault(policy["metadata"]["namespace"], set()).add(policy["metadata"]["name"])
    assert names == {first: PROJECT_POLICIES, second: PROJECT_POLICIES, SYSTEM: SYSTEM_POLICIES}


def test_ensure_namespace_again_leaves_the_policies_as_they_are(
    real_plane: RealPlane, stored: tuple[str, str, list[dict[str, Any]]]
) -> None:
    """A second call (another daemon process, a namespace found after an upgrade) is answered
    409 for each object and changes nothing."""
    first, _, policies = stored

    def versions(items: list[dict[str, Any]]) -> dict[str, str]:
        return {
            p["metadata"]["name"]: p["metadata"]["resourceVersion"]
            for p in items
            if p["metadata"]["namespace"] == first
        }

    before = versions(policies)
    backend = KubernetesBackend(real_plane.api, KubernetesConfig(request_timeout_s=10.0))
    backend.ensure_namespace(first)
    assert versions(_policies(real_plane, first)) == before


def _world(first: str, second: str) -> dict[str, Pod]:
    job = {"app.kubernetes.io/managed-by": "gantry", "gantry.io/job-id": "7"}
    platform = {"app.kubernetes.io/part-of": "gantry"}
    return {
        "job": Pod(first, job, "10.244.1.10", {"http": 8080}),
        "gang_peer": Pod(first, {**job, "gantry.io/replica": "1"}, "10.244.2.11"),
        "other_tenant": Pod(second, job, "10.244.3.12", {"http": 8080}),
        "web": Pod(
            SYSTEM,
            {**platform, "app.kubernetes.io/name": "gantry-web"},
            "10.244.0.5",
            {"http": 8000},
        ),
        "scheduler": Pod(
            SYSTEM,
            {**platform, "app.kubernetes.io/name": "gantry-scheduler"},
            "10.244.0.6",
            {"metrics": 9402},
        ),
        "agent": Pod(
            SYSTEM,
            {**platform, "app.kubernetes.io/name": "gantry-node-agent"},
            "10.244.1.2",
            {"metrics": 9400},
        ),
        "worker": Pod(
            SYSTEM, {**platform, "app.kubernetes.io/name": "gantry-worker"}, "10.244.0.7"
        ),
        "postgres": Pod(
            SYSTEM,
            {**platform, "app.kubernetes.io/component": "postgresql"},
            "10.244.0.8",
            {"pg": 5432},
        ),
        "redis": Pod(SYSTEM, {**platform, "app.kubernetes.io/component": "redis"}, "10.244.0.9"),
        "dns": Pod("kube-system", {"k8s-app": "kube-dns"}, "10.244.0.2", {"dns": 53}),
        "metrics_server": Pod("kube-system", {"k8s-app": "metrics-server"}, "10.244.0.3"),
        "ingress": Pod("ingress-nginx", {"app.kubernetes.io/name": "ingress-nginx"}, "10.244.0.4"),
        "prometheus": Pod("monitoring", {"app.kubernetes.io/name": "prometheus"}, "10.244.0.10"),
        "impostor": Pod("monitoring", {"app.kubernetes.io/name": "grafana"}, "10.244.0.11"),
    }


# (source, target, port, protocol, allowed): a pod's name in _world, or an address.
CONNECTIONS = [
    # A project's pods reach each other (a gang's MASTER_ADDR), and nobody else's.
    ("job", "gang_peer", 29500, "TCP", True),
    ("gang_peer", "job", 8080, "TCP", True),
    ("job", "other_tenant", 8080, "TCP", False),
    ("other_tenant", "job", 8080, "TCP", False),
    # The cluster DNS, and nothing else of kube-system.
    ("job", "dns", 53, "UDP", True),
    ("job", "dns", 53, "TCP", True),
    ("job", "dns", 443, "TCP", False),
    ("job", "metrics_server", 53, "UDP", False),
    # The internet, but not the metadata address, the API server's Service or private ranges.
    ("job", "8.8.8.8", 443, "TCP", True),
    ("job", "2001:4860:4860::8888", 443, "TCP", True),
    ("job", "169.254.169.254", 80, "TCP", False),
    ("job", "fd00:ec2::254", 80, "TCP", False),
    ("job", "10.96.0.1", 443, "TCP", False),
    ("job", "192.168.1.5", 22, "TCP", False),
    ("job", "172.20.0.1", 5432, "TCP", False),
    # Gantry itself is out of a tenant's reach.
    ("job", "web", 8000, "TCP", False),
    ("job", "agent", 9400, "TCP", False),
    ("job", "postgres", 5432, "TCP", False),
    ("job", "redis", 6379, "TCP", False),
    # The web: from the ingress controller, Prometheus and the node agents only.
    ("ingress", "web", 8000, "TCP", True),
    ("prometheus", "web", 8000, "TCP", True),
    ("agent", "web", 8000, "TCP", True),
    ("impostor", "web", 8000, "TCP", False),
    ("ingress", "web", 9402, "TCP", False),
    # /metrics: Prometheus only.
    ("prometheus", "agent", 9400, "TCP", True),
    ("prometheus", "scheduler", 9402, "TCP", True),
    ("impostor", "agent", 9400, "TCP", False),
    ("web", "agent", 9400, "TCP", False),
    ("ingress", "scheduler", 9402, "TCP", False),
    # The databases: Gantry's pods only.
    ("scheduler", "postgres", 5432, "TCP", True),
    ("worker", "redis", 6379, "TCP", True),
    ("web", "postgres", 5432, "TCP", True),
    ("ingress", "postgres", 5432, "TCP", False),
    ("prometheus", "redis", 6379, "TCP", False),
]


@pytest.mark.parametrize(
    ("source", "target", "port", "protocol", "allowed"),
    CONNECTIONS,
    ids=[f"{s}->{t}:{p}/{proto}" for s, t, p, proto, _ in CONNECTIONS],
)
def test_the_stored_policies_allow_exactly_what_they_should(
    stored: tuple[str, str, list[dict[str, Any]]],
    source: str,
    target: str,
    port: int,
    protocol: str,
    allowed: bool,
) -> None:
    first, second, policies = stored
    world = _world(first, second)
    assert connects(policies, world[source], world.get(target, target), port, protocol) is allowed


@pytest.mark.parametrize("source", ["job", "other_tenant"])
@pytest.mark.parametrize(("target", "port"), [("web", 8000), ("agent", 9400), ("postgres", 5432)])
def test_gantry_system_refuses_tenants_on_its_own(
    stored: tuple[str, str, list[dict[str, Any]]], source: str, target: str, port: int
) -> None:
    """gantry-system's ingress policies hold even where a tenant's egress would not (a project
    namespace made by hand, an operator's allow-all in it)."""
    first, second, policies = stored
    world = _world(first, second)
    assert not ingress_allows(policies, world[target], world[source], port)
