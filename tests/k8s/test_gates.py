"""Scheduling gates as the real API server keeps them, and the fake after it (issue 37).

Gantry's admission webhook gates the pods users create in its namespaces; admitting one is
removing the gate, then binding. What the real server taught, on both servers: the gated pod
shows PodScheduled=False with reason SchedulingGated from its creation; it cannot be bound
while gated (409); a gate can be removed, never added (422); a pod with a gate and a node name
is refused (422).
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from kubernetes import client

from tests.k8s.conftest import PAUSE, api_client_for
from tests.k8s.fake_apiserver import FakeApiServer
from tests.k8s.real_api import Answer
from tests.k8s.real_api import request as call
from tests.k8s.real_plane import RealPlane, wait_for

Obj = dict[str, Any]
GATE = "gantry.io/admission"


@dataclass
class Server:
    api: client.ApiClient
    namespace: str
    node: str

    def pods(self, name: str = "") -> str:
        return f"/api/v1/namespaces/{self.namespace}/pods" + (f"/{name}" if name else "")

    def create(self, name: str, **spec: Any) -> Answer:
        containers = [{"name": "main", "image": PAUSE}]
        body = {"metadata": {"name": name}, "spec": {"containers": containers, **spec}}
        return call(self.api, "POST", self.pods(), body=body)

    def bind(self, name: str) -> Answer:
        body = {
            "apiVersion": "v1",
            "kind": "Binding",
            "metadata": {"name": name},
            "target": {"apiVersion": "v1", "kind": "Node", "name": self.node},
        }
        return call(self.api, "POST", f"{self.pods(name)}/binding", body=body)

    def merge(self, name: str, patch: Obj) -> Answer:
        return call(
            self.api,
            "PATCH",
            self.pods(name),
            body=patch,
            content_type="application/merge-patch+json",
        )


@pytest.fixture(params=["fake", pytest.param("real", marks=pytest.mark.kubernetes)])
def server(request: pytest.FixtureRequest) -> Iterator[Server]:
    if request.param == "fake":
        fake: FakeApiServer = request.getfixturevalue("fake")
        fake.add_namespace("gates", {})
        api = api_client_for(fake.url)
        yield Server(api, "gates", "gpu-1")
        api.close()
        return
    plane: RealPlane = request.getfixturevalue("real_plane")
    if not plane.nodes:
        pytest.skip("no ready, schedulable node to bind to")
    namespace = f"gates-{uuid.uuid4().hex[:8]}"
    assert (
        call(plane.api, "POST", "/api/v1/namespaces", body={"metadata": {"name": namespace}}).status
        == 201
    )
    core: Any = client.CoreV1Api(plane.api)
    wait_for(core.list_namespaced_service_account, namespace, "default", lambda a: a is not None)
    yield Server(plane.api, namespace, plane.nodes[0])
    call(plane.api, "DELETE", f"/api/v1/namespaces/{namespace}")


def test_a_gated_pod_says_so_and_cannot_be_bound(server: Server) -> None:
    created = server.create("gated", schedulingGates=[{"name": GATE}])
    assert created.status == 201, created.body
    (condition,) = created.body["status"]["conditions"]
    assert (condition["type"], condition["status"], condition["reason"]) == (
        "PodScheduled",
        "False",
        "SchedulingGated",
    )
    refused = server.bind("gated")
    assert refused.status == 409
    assert refused.message.endswith("pod gated has non-empty .spec.schedulingGates")


def test_a_gate_is_removed_then_the_pod_binds(server: Server) -> None:
    assert server.create("admitted", schedulingGates=[{"name": GATE}]).status == 201
    removed = server.merge("admitted", {"spec": {"schedulingGates": None}})
    assert removed.status == 200, removed.body
    assert not removed.body["spec"].get("schedulingGates")
    assert server.bind("admitted").status == 201


def test_a_gate_cannot_be_added_after_creation(server: Server) -> None:
    """Gantry cannot hold a pod again once it runs: preempting one is deleting it."""
    assert server.create("late", schedulingGates=[{"name": "example.com/first"}]).status == 201
    gates = [{"name": "example.com/first"}, {"name": GATE}]
    refused = server.merge("late", {"spec": {"schedulingGates": gates}})
    assert refused.status == 422
    assert "only deletion is allowed, but found new scheduling gate 'gantry.io/admission'" in (
        refused.message
    )


def test_a_gate_and_a_node_name_are_refused_together(server: Server) -> None:
    refused = server.create("placed", nodeName=server.node, schedulingGates=[{"name": GATE}])
    assert refused.status == 422
    assert refused.message == (
        'Pod "placed" is invalid: spec.nodeName: Forbidden: cannot be set until all '
        "schedulingGates have been cleared"
    )
