"""The node agent's token is bound to its node (issue 17, point 5).

One shared agent token could report XID errors for every node (cordoning all of them and
failing every running job) or invent healthy devices. Now each agent account
(`manage.py node_agent_token NODE`) reports for its node only, and only for the devices the
cluster lists; platform admins still report for any node.
"""

from __future__ import annotations

from io import StringIO
from typing import Any

import pytest
from django.contrib.auth.models import Permission
from django.core.management import CommandError, call_command
from django.test import Client
from rest_framework.authtoken.models import Token
from rest_framework.test import APIClient

from scheduler.models import GpuDevice, Node, NodeAgent
from tests import factories as f
from tests.conftest import Org

URL = "/api/v1/nodes/report/"


def make_node(name: str, gpus: int = 2) -> Node:
    node = f.NodeFactory(name=name)
    for index in range(gpus):
        GpuDevice.objects.create(node=node, index=index, uuid=f"GPU-{name}-{index}",
                                 model="H100-80GB", memory_mib=81920)  # fmt: skip
    return node


def reading(index: int, xids: list[int] | None = None, memory: int = 81559) -> dict[str, Any]:
    return {"index": index, "uuid": f"GPU-{index}", "name": "NVIDIA H100 80GB HBM3",
            "memory_total_mib": memory, "memory_used_mib": 1024, "utilization_pct": 50.0,
            "temperature_c": 60.0, "ecc_uncorrected": 0, "xid_errors": xids or [],
            "healthy": True}  # fmt: skip


def body(node: str, *gpus: dict[str, Any]) -> dict[str, Any]:
    return {"node": node, "driver_version": "550.54.15", "gpus": list(gpus)}


def agent_token(node: str) -> str:
    out = StringIO()
    call_command("node_agent_token", node, stdout=out)
    return out.getvalue().strip()


def agent_client(node: str) -> Client:
    return Client(headers={"Authorization": f"Token {agent_token(node)}"})


def post(client: Any, payload: Any) -> Any:
    return client.post(URL, payload, content_type="application/json")


@pytest.fixture
def nodes(org: Org) -> tuple[Node, Node]:
    return make_node("gpu-a"), make_node("gpu-b")


def test_an_agent_reports_for_its_own_node(nodes: tuple[Node, Node]) -> None:
    response = post(agent_client("gpu-a"), body("gpu-a", reading(0, [79])))
    assert response.status_code == 200, response.json()
    device = GpuDevice.objects.get(node__name="gpu-a", index=0)
    assert (device.healthy, device.health_reason) == (False, "XID 79")


def test_an_agent_cannot_report_for_another_node(nodes: tuple[Node, Node]) -> None:
    response = post(agent_client("gpu-a"), body("gpu-b", reading(0, [79])))
    assert response.status_code == 403
    assert "reports for node 'gpu-a' only" in response.json()["detail"]
    assert GpuDevice.objects.filter(node__name="gpu-b", healthy=False).count() == 0
    assert Node.objects.get(name="gpu-b").last_report_at is None


def test_a_device_the_cluster_does_not_list_is_refused(nodes: tuple[Node, Node]) -> None:
    response = post(agent_client("gpu-a"), body("gpu-a", reading(0), reading(9)))
    assert response.status_code == 400
    assert "GPU index 9 is not in node gpu-a's inventory" in str(response.json()["errors"])
    assert not GpuDevice.objects.filter(node__name="gpu-a", index=9).exists()
    assert GpuDevice.objects.get(node__name="gpu-a", index=0).reported_at is None  # no write


def test_a_report_does_not_change_what_the_device_is(nodes: tuple[Node, Node]) -> None:
    post(agent_client("gpu-a"), body("gpu-a", reading(1, memory=10**6)))
    device = GpuDevice.objects.get(node__name="gpu-a", index=1)
    assert (device.memory_mib, device.model) == (81920, "H100-80GB")
    assert device.memory_used_mib == 1024


def test_the_old_shared_permission_alone_reports_for_no_node(nodes: tuple[Node, Node]) -> None:
    shared = f.UserFactory(username="node-agent")
    shared.user_permissions.add(Permission.objects.get(codename="report_gpu_health"))
    client = APIClient()
    client.force_authenticate(shared)
    assert post(client, body("gpu-a", reading(0))).status_code == 403


def test_a_platform_admin_reports_for_any_node(
    org: Org, client_for: Any, nodes: tuple[Node, Node]
) -> None:
    for name in ("gpu-a", "gpu-b"):
        response = client_for("pat").post(URL, body(name, reading(1)), format="json")
        assert response.status_code == 200, response.json()


@pytest.mark.parametrize("who", ["alice", "tina", "carol"])
def test_others_may_not_report(
    org: Org, client_for: Any, nodes: tuple[Node, Node], who: str
) -> None:
    response = client_for(who).post(URL, body("gpu-a", reading(0, [79])), format="json")
    assert response.status_code == 403


def test_rotating_the_token_ends_the_old_one(nodes: tuple[Node, Node]) -> None:
    old = agent_token("gpu-a")
    assert agent_token("gpu-a") == old  # asked again: the same token
    out = StringIO()
    call_command("node_agent_token", "gpu-a", "--rotate", stdout=out)
    new = out.getvalue().strip()
    assert new != old
    stale = Client(headers={"Authorization": f"Token {old}"})
    refused = post(stale, body("gpu-a", reading(0)))
    assert refused.status_code == 403 and refused.json()["detail"] == "Invalid token."
    fresh = Client(headers={"Authorization": f"Token {new}"})
    assert post(fresh, body("gpu-a", reading(0))).status_code == 200


def test_revoking_deletes_the_agent_account(nodes: tuple[Node, Node]) -> None:
    token = agent_token("gpu-a")
    call_command("node_agent_token", "gpu-a", "--revoke", stdout=StringIO())
    assert not NodeAgent.objects.exists() and not Token.objects.filter(key=token).exists()
    with pytest.raises(CommandError, match="no agent account"):
        call_command("node_agent_token", "gpu-a", "--revoke", stdout=StringIO())


@pytest.mark.parametrize("name", ["Bad_Node", "a" * 254, "node\n", "x..y"])
def test_the_command_refuses_what_is_not_a_node_name(db: Any, name: str) -> None:
    with pytest.raises(CommandError, match="not a Kubernetes node name"):
        call_command("node_agent_token", name, stdout=StringIO())


def test_an_agent_account_cannot_log_in_with_a_password(nodes: tuple[Node, Node]) -> None:
    agent_token("gpu-a")
    user = NodeAgent.objects.get(node_name="gpu-a").user
    assert not user.has_usable_password()
