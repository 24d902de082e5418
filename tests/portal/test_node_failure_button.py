"""Simulated node failure from the portal (issue 35): a platform admin fails a node of the
simulated cluster from its page and recovers it, through the service of
`POST /api/v1/nodes/{id}/fail/` (audited there); the buttons are there only on the simulated
backend, behind a confirmation and the CSRF check; everyone else gets the 404 of every node
page."""

from __future__ import annotations

import re
from typing import Any

import pytest
from django.test import Client
from django.urls import reverse

from scheduler.models import Node
from tenants.models import AuditEntry
from tests.conftest import Org
from tests.portal.test_nodes_page import make_node

pytestmark = pytest.mark.django_db


def act(client: Client, node: Node, action: str) -> Any:
    url = reverse("portal:node-action", args=[node.pk])
    return client.post(url, {"action": action}, follow=True)


def detail(client: Client, node: Node) -> str:
    return client.get(reverse("portal:node-detail", args=[node.pk])).content.decode()


def test_a_platform_admin_fails_and_recovers_a_simulated_node(org: Org, web_for: Any) -> None:
    node = make_node("gpu-a")
    pat = web_for("pat")
    button = re.search(
        r'<button[^>]*value="fail"[^>]*>Simulate failure</button>', detail(pat, node)
    )
    assert button is not None and "data-confirm=" in button.group(0)
    html = act(pat, node, "fail").content.decode()
    node.refresh_from_db()
    assert node.sim_failed
    assert "Node gpu-a failed (simulated)" in html
    assert 'value="recover"' in html and 'value="fail"' not in html
    assert 'id="node-health">not ready<' in html
    assert AuditEntry.objects.get(action="node.fail").actor == org.users["pat"]
    html = act(pat, node, "recover").content.decode()
    node.refresh_from_db()
    assert not node.sim_failed and "Node gpu-a recovered (simulated)" in html
    assert AuditEntry.objects.filter(action="node.heal").count() == 1


def test_not_on_a_real_cluster(org: Org, web_for: Any, settings: Any) -> None:
    settings.GANTRY_CLUSTER_BACKEND = "kubernetes"
    node = make_node("gpu-a")
    pat = web_for("pat")
    html = detail(pat, node)
    assert 'value="fail"' not in html and "Simulate failure" not in html
    response = act(pat, node, "fail")
    node.refresh_from_db()
    assert not node.sim_failed and not AuditEntry.objects.filter(action="node.fail").exists()
    assert "simulated only on the simulated cluster" in response.content.decode()


@pytest.mark.parametrize("persona", ["alice", "tina", "dana", "carol"])
def test_no_one_else_may_fail_a_node(org: Org, web_for: Any, persona: str) -> None:
    node = make_node("gpu-a")
    url = reverse("portal:node-action", args=[node.pk])
    assert web_for(persona).post(url, {"action": "fail"}).status_code == 404
    node.refresh_from_db()
    assert not node.sim_failed


def test_failing_a_node_needs_the_csrf_token(org: Org) -> None:
    node = make_node("gpu-a")
    client = Client(enforce_csrf_checks=True)
    client.force_login(org.users["pat"])
    response = client.post(reverse("portal:node-action", args=[node.pk]), {"action": "fail"})
    assert response.status_code == 403
    node.refresh_from_db()
    assert not node.sim_failed
