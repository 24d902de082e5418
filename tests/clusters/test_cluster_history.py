"""Utilization history per cluster (issue 38): each cluster's GPUs allocated and used per
window, from the device roll-ups (`scheduler.telemetry.cluster_history`), through
`GET /api/v1/clusters/utilization/` (a `cluster` filter) and on the Clusters page.

Three devices: `local:0` on a node without a cluster (the home cluster's), `b:0` and `b:1` on
site-b's node. One 5-minute window (300 s; a sample every 30 s, 10 samples a device):
local:0 held whole at 50 %; b:0 held whole at 100 %; b:1 held at half a share, idle (0 %).
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.test import Client
from django.utils import timezone

from scheduler.models import Cluster, GpuDevice, RollupScope, UtilizationRollup
from scheduler.telemetry.cluster_history import utilization_by_cluster
from scheduler.telemetry.dashboards import window_for
from tests import factories as f
from tests.conftest import Org

URL = "/api/v1/clusters/utilization/"


@pytest.fixture
def history(db: Any, settings: Any) -> dict[str, Any]:
    settings.GANTRY_UTILIZATION_SAMPLE_S = 30
    site_b = Cluster.objects.create(name="site-b", backend="simulated")
    home_node = f.NodeFactory(name="n1", cluster=None)
    b_node = f.NodeFactory(name="site-b:n1", cluster=site_b)
    devices = {
        "local:0": GpuDevice.objects.create(node=home_node, index=0),
        "b:0": GpuDevice.objects.create(node=b_node, index=0),
        "b:1": GpuDevice.objects.create(node=b_node, index=1),
    }
    window = window_for("24h", timezone.now())
    start = window.until - timedelta(minutes=15)

    def rollup(key_id: int, gpu_seconds: float, mean: float, scope: str = "device") -> None:
        UtilizationRollup.objects.create(
            period="5m",
            scope=scope,
            key_id=key_id,
            flavor="H100-80GB",
            start=start,
            samples=10,
            utilization_mean=mean,
            utilization_max=mean,
            utilization_p95=mean,
            gpu_seconds=gpu_seconds,
        )

    rollup(devices["local:0"].pk, 300, 50)
    rollup(devices["b:0"].pk, 300, 100)
    rollup(devices["b:1"].pk, 150, 0)
    rollup(0, 900, 80, scope=RollupScope.FLAVOR)  # the flavor's row: not a device's
    rollup(10**9, 300, 100)  # a device removed since: no cluster to read
    return {"start": start, "site_b": site_b, "home": Cluster.objects.get(home=True)}


def figures(series: dict[str, Any]) -> dict[str, list[tuple[float, float]]]:
    return {name: [(p.allocated, p.used) for p in points] for name, points in series.items()}


def test_each_cluster_sums_its_devices_windows(history: dict[str, Any]) -> None:
    window = window_for("24h", timezone.now())
    # home: 300 s / 300 s = 1 GPU held; 10 samples x 30 s / 300 s = 1 device at 50 % = 0.5
    # site-b: (300 + 150) / 300 = 1.5 held; 2 devices, at 100 % and 0 %: 1.0 busy
    assert figures(utilization_by_cluster(window)) == {
        history["home"].name: [(1.0, 0.5)],
        "site-b": [(1.5, 1.0)],
    }
    assert figures(utilization_by_cluster(window, history["site_b"])) == {"site-b": [(1.5, 1.0)]}


def test_one_query_whatever_the_clusters(
    history: dict[str, Any], django_assert_num_queries: Any
) -> None:
    window = window_for("7d", timezone.now())
    with django_assert_num_queries(1):
        utilization_by_cluster(window)


def test_the_api_filters_by_cluster(org: Org, history: dict[str, Any], client_for: Any) -> None:
    client = client_for("carol")  # finance, as the cluster dashboard
    every = client.get(URL).json()
    assert every["range"] == "24h" and every["period"] == "5m"
    assert [s["cluster"] for s in every["clusters"]] == sorted([history["home"].name, "site-b"])
    only = client.get(URL, {"cluster": "site-b", "range": "6h"}).json()
    assert only["clusters"] == [
        {
            "cluster": "site-b",
            "points": [
                {
                    "start": history["start"].isoformat().replace("+00:00", "Z"),
                    "allocated_gpus": 1.5,
                    "used_gpus": 1.0,
                }
            ],
        }
    ]


@pytest.mark.parametrize(
    ("query", "field"),
    [({"cluster": "nowhere"}, "cluster"), ({"range": "1y"}, "range"), ({"flavor": "x"}, "flavor")],
)
def test_a_bad_query_is_a_400_naming_it(
    org: Org, history: dict[str, Any], client_for: Any, query: dict[str, str], field: str
) -> None:
    answer = client_for("pat").get(URL, query)
    assert answer.status_code == 400
    assert field in answer.json()["errors"]


@pytest.mark.parametrize(("persona", "reads"), [("alice", False), ("tina", True), ("dana", True)])
def test_read_as_the_clusters_api(
    org: Org, history: dict[str, Any], client_for: Any, persona: str, reads: bool
) -> None:
    """Those who read the clusters (tenant admins too) read their history; members get an
    empty list, and no cluster name is known to them."""
    client = client_for(persona)
    listed = client.get(URL).json()["clusters"]
    assert bool(listed) is reads
    assert client.get(URL, {"cluster": "site-b"}).status_code == (200 if reads else 400)


def test_the_clusters_page_draws_a_series_per_cluster(org: Org, history: dict[str, Any]) -> None:
    web = Client()
    web.force_login(org.users["pat"])
    page = web.get("/clusters/", {"range": "6h"})
    assert page.status_code == 200
    html = page.content.decode()
    assert 'id="figure-cluster-history"' in html
    assert "site-b allocated" in html and f"{history['home'].name} used" in html
    table = html[html.index('id="table-cluster-history"') :]
    assert '<tr data-cluster="site-b"><th scope="row">site-b</th>' in table
    assert "1.50" in table and "0.50" in table
    assert web.get("/clusters/", {"range": "1y"}).status_code == 400
