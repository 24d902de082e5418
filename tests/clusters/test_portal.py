"""The Clusters page (platform admins: each cluster's state, nodes, GPUs, use, last seen;
cordon and uncordon) and the Nodes page filtered by cluster."""

from __future__ import annotations

from typing import Any

import pytest
from django.test import Client

from scheduler.backends.base import GpuInfo, NodeInfo
from scheduler.models import Cluster, GpuDevice
from scheduler.nodes.services import node_sync
from tenants.models import AuditEntry

pytestmark = pytest.mark.django_db


def _client(user: Any) -> Client:
    client = Client()
    client.force_login(user)
    return client


def _nodes() -> Cluster:
    b = Cluster.objects.create(
        name="site-b", backend="kubernetes", kubeconfig_path="/k", labels={"region": "eu"}
    )
    gpus = tuple(GpuInfo(i, 81920) for i in range(4))
    node_sync(
        [
            NodeInfo("h1", "H100-80GB", gpus, 1000, 1000),
            NodeInfo(
                "site-b:n1", "H100-80GB", gpus, 1000, 1000, labels={"gantry.io/cluster": "site-b"}
            ),
        ]
    )
    GpuDevice.objects.filter(node__name="site-b:n1", index=0).update(allocated_milli=1000)
    return b


def test_the_clusters_page_shows_each_clusters_inventory_and_use(org: Any) -> None:
    _nodes()
    page = _client(org.users["pat"]).get("/clusters/")
    assert page.status_code == 200
    html = page.content.decode()
    row = html[html.index('data-cluster="site-b"') :].split("</tr>")[0]
    # 1 of 4 GPUs allocated: 25%
    assert "eu" in row and "1 / 1" in row and "25%" in row and "active" in row
    assert 'data-cluster="local"' in html


@pytest.mark.parametrize("persona", ["alice", "tina", "carol"])
def test_only_platform_admins_see_or_cordon(org: Any, persona: str) -> None:
    b = _nodes()
    client = _client(org.users[persona])
    assert client.get("/clusters/").status_code == 404
    assert client.post(f"/clusters/{b.pk}/action/", {"action": "cordon"}).status_code == 404
    assert Cluster.objects.get(pk=b.pk).state == "active"


def test_a_platform_admin_cordons_and_uncordons_audited(org: Any) -> None:
    b = _nodes()
    client = _client(org.users["pat"])
    assert client.post(f"/clusters/{b.pk}/action/", {"action": "cordon"}).status_code == 302
    assert Cluster.objects.get(pk=b.pk).state == "cordoned"
    client.post(f"/clusters/{b.pk}/action/", {"action": "uncordon"})
    assert Cluster.objects.get(pk=b.pk).state == "active"
    assert AuditEntry.objects.filter(action__in=["cluster.cordon", "cluster.uncordon"]).count() == 2
    client.post(f"/clusters/{b.pk}/action/", {"action": "explode"})
    assert Cluster.objects.get(pk=b.pk).state == "active"


def test_the_nodes_page_filters_by_cluster(org: Any) -> None:
    _nodes()
    client = _client(org.users["pat"])
    html = client.get("/nodes/?cluster=site-b").content.decode()
    assert 'data-node="site-b:n1"' in html and 'data-node="h1"' not in html
    html = client.get("/nodes/?cluster=local").content.decode()
    assert 'data-node="h1"' in html and 'data-node="site-b:n1"' not in html
    assert client.get("/nodes/?cluster=nowhere").status_code == 400
