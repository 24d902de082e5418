"""The node agent's service-account token, verified by a real API server (issue 34, item 6).

As the kubelet would for an agent pod, the test asks the TokenRequest API for a token of
gantry-node-agent bound to a pod on a node (Node objects made directly in the API server), with
the agent's audience. The web verifies it with a TokenReview made with its own service account's
token (gantry-app: 02-rbac.yaml grants it exactly that), and takes the report for the pod's node
and no other. A token without a pod, of another account, or for the API server's audience is
refused.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from django.test import Client
from django.test.utils import override_settings

from scheduler.models import GpuDevice, Node
from scheduler.nodes import agent_auth
from scheduler.nodes.agent_auth import KubernetesTokenReviewer, VerdictCache
from tests.api.test_node_agent import body, make_node, post, reading
from tests.conftest import Org
from tests.k8s.real_api import Paths, apply, client_with_token, manifests, request, token_for
from tests.k8s.real_plane import RealPlane

pytestmark = pytest.mark.kubernetes

NAMESPACE = "gantry-system"
AUDIENCE = "gantry-agent"
# Admitted by Pod Security `restricted` (gantry-system enforces it); never runs (no kubelet).
CONTAINER = {
    "name": "agent",
    "image": "gantry:0.1.0",
    "securityContext": {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}},
}


@dataclass
class Cluster:
    api: Any
    nodes: tuple[str, str]
    pods: dict[str, dict[str, Any]]  # account -> its pod on nodes[0]
    web: Any  # a client with gantry-app's token


def _node(api: Any, name: str) -> None:
    node = {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name}}
    assert request(api, "POST", "/api/v1/nodes", body=node).status == 201


def _pod(api: Any, account: str, node: str) -> dict[str, Any]:
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": f"{account}-{uuid.uuid4().hex[:6]}"},
        "spec": {
            "serviceAccountName": account,
            "automountServiceAccountToken": False,
            "nodeName": node,
            "priorityClassName": "gantry-platform",
            "securityContext": {
                "runAsNonRoot": True,
                "runAsUser": 10001,
                "seccompProfile": {"type": "RuntimeDefault"},
            },
            "containers": [CONTAINER],
        },
    }
    created = request(api, "POST", f"/api/v1/namespaces/{NAMESPACE}/pods", body=pod)
    assert created.status == 201, created
    return created.body


@pytest.fixture(scope="module")
def cluster(real_plane: RealPlane) -> Iterator[Cluster]:
    api = real_plane.api
    paths = Paths(api)
    for manifest in manifests("00-namespace.yaml", "01-priorityclasses.yaml", "02-rbac.yaml"):
        answer = apply(api, paths, manifest.doc)
        assert answer.status in (200, 201), f"{manifest.id}: {answer.message}"
    suffix = uuid.uuid4().hex[:6]
    nodes = (f"agent-node-{suffix}-a", f"agent-node-{suffix}-b")
    for name in nodes:
        _node(api, name)
    pods = {
        account: _pod(api, account, nodes[0]) for account in ("gantry-node-agent", "gantry-migrate")
    }
    web = client_with_token(api, token_for(api, NAMESPACE, "gantry-app"))
    yield Cluster(api, nodes, pods, web)
    web.close()
    for pod in pods.values():
        name = pod["metadata"]["name"]
        request(
            api,
            "DELETE",
            f"/api/v1/namespaces/{NAMESPACE}/pods/{name}",
            query=[("gracePeriodSeconds", "0")],
        )
    for name in nodes:
        request(api, "DELETE", f"/api/v1/nodes/{name}")


def _token(cluster: Cluster, account: str, *, bound: bool = True, audience: str = AUDIENCE) -> str:
    """What the kubelet mounts in the pod's projected volume (TokenRequest bound to the pod)."""
    spec: dict[str, Any] = {"audiences": [audience], "expirationSeconds": 600}
    if bound:
        pod = cluster.pods[account]["metadata"]
        spec["boundObjectRef"] = {
            "kind": "Pod",
            "apiVersion": "v1",
            "name": pod["name"],
            "uid": pod["uid"],
        }
    path = f"/api/v1/namespaces/{NAMESPACE}/serviceaccounts/{account}/token"
    answer = request(
        cluster.api,
        "POST",
        path,
        body={"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": spec},
    )
    assert answer.status == 201, answer
    token: str = answer.body["status"]["token"]
    return token


@pytest.fixture
def web(cluster: Cluster, org: Org, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[str, str]]:
    """The web's reviewer on the real API server, with its own account's token; a fresh cache;
    the two nodes in Gantry's inventory."""
    monkeypatch.setattr(agent_auth, "_reviewer", KubernetesTokenReviewer(cluster.web))
    monkeypatch.setattr(agent_auth, "CACHE", VerdictCache())
    mine, other = cluster.nodes
    make_node(mine)
    make_node(other)
    with override_settings(GANTRY_AGENT_TOKEN_REVIEW=True):
        yield mine, other


def bearer(token: str) -> Client:
    return Client(headers={"Authorization": f"Bearer {token}"})


def test_the_pods_token_reports_for_its_node_and_no_other(
    cluster: Cluster, web: tuple[str, str]
) -> None:
    mine, other = web
    token = _token(cluster, "gantry-node-agent")
    taken = post(bearer(token), body(mine, reading(0, [79])))
    assert taken.status_code == 200, taken.json()
    assert GpuDevice.objects.get(node__name=mine, index=0).health_reason == "XID 79"
    refused = post(bearer(token), body(other, reading(0, [79])))
    assert refused.status_code == 403
    assert f"reports for node '{mine}' only" in refused.json()["detail"]
    assert GpuDevice.objects.get(node__name=other, index=0).healthy
    assert Node.objects.get(name=other).last_report_at is None


@pytest.mark.parametrize(
    ("account", "bound", "audience", "why"),
    [
        ("gantry-node-agent", False, AUDIENCE, "not bound to a pod"),
        ("gantry-migrate", True, AUDIENCE, "not the node agent's service account"),
        ("gantry-node-agent", True, "https://kubernetes.default.svc.cluster.local", "not valid"),
    ],
    ids=["unbound", "another-account", "the-api-servers-audience"],
)
def test_other_tokens_are_refused(
    cluster: Cluster, web: tuple[str, str], account: str, bound: bool, audience: str, why: str
) -> None:
    mine, _ = web
    token = _token(cluster, account, bound=bound, audience=audience)
    refused = post(bearer(token), body(mine, reading(0, [79])))
    assert refused.status_code == 403, refused.json()
    assert why in refused.json()["detail"]
    assert GpuDevice.objects.get(node__name=mine, index=0).healthy
