"""`gantry clusters` and `gantry nodes --cluster` against a live server (issue 38)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from scheduler.backends.base import GpuInfo, NodeInfo
from scheduler.models import Cluster
from scheduler.nodes.services import node_sync
from tests.conftest import Org

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def home() -> Cluster:
    """The migration's home cluster (a transactional test's flush removes it)."""
    made, _ = Cluster.objects.get_or_create(
        home=True, defaults={"name": "local", "backend": "simulated"}
    )
    return made


def test_a_platform_admin_adds_cordons_and_lists_clusters(gantry: Any, org: Org) -> None:
    code, out, err = gantry(
        "pat", "clusters", "add", "site-b", "--kubeconfig-secret", "site-b", "--region", "eu"
    )
    assert code == 0, err
    assert Cluster.objects.get(name="site-b").labels == {"region": "eu"}
    code, out, err = gantry("pat", "clusters", "cordon", "site-b")
    assert code == 0, err
    assert Cluster.objects.get(name="site-b").state == "cordoned"
    code, out, _ = gantry("pat", "clusters")
    lines = out.splitlines()
    assert lines[0].split()[:3] == ["NAME", "BACKEND", "STATE"]
    assert any(line.startswith("local (home)") for line in lines)
    row = next(line for line in lines if line.startswith("site-b"))
    assert "cordoned" in row and "eu" in row
    code, out, _ = gantry("pat", "--json", "clusters")
    assert [c["name"] for c in json.loads(out)] == ["local", "site-b"]


def test_a_reader_may_not_add_and_is_told(gantry: Any, org: Org) -> None:
    code, _, err = gantry("carol", "clusters", "add", "site-b", "--backend", "simulated")
    assert code != 0 and "platform admins" in err.lower()
    assert not Cluster.objects.filter(name="site-b").exists()


def test_bad_input_says_what_was_wrong(gantry: Any, org: Org) -> None:
    code, _, err = gantry("pat", "clusters", "add", "Site_B", "--backend", "simulated")
    assert code != 0 and "name" in err
    assert Cluster.objects.count() == 1


def test_nodes_of_one_cluster(gantry: Any, org: Org) -> None:
    Cluster.objects.create(name="site-b", backend="simulated")
    gpu = (GpuInfo(0, 81920),)
    node_sync(
        [
            NodeInfo("h1", "H100-80GB", gpu, 1000, 1000),
            NodeInfo(
                "site-b:n1", "H100-80GB", gpu, 1000, 1000, labels={"gantry.io/cluster": "site-b"}
            ),
        ]
    )
    code, out, err = gantry("pat", "nodes", "--cluster", "site-b")
    assert code == 0, err
    assert "site-b:n1" in out and "h1" not in out


def test_a_platform_admin_labels_a_cluster_with_the_data_it_holds(gantry: Any, org: Org) -> None:
    imagenet = "data.example.com/imagenet"
    code, _, err = gantry(
        "pat", "clusters", "add", "site-b", "--backend", "simulated", "--label", f"{imagenet}=true"
    )
    assert code == 0, err
    code, out, err = gantry("pat", "clusters", "label", "site-b", "storage=ceph", "region=eu")
    assert code == 0, err
    assert Cluster.objects.get(name="site-b").labels == {
        imagenet: "true",
        "storage": "ceph",
        "region": "eu",
    }
    row = next(line for line in out.splitlines() if line.startswith("site-b"))
    assert f"{imagenet}=true,storage=ceph" in row
    code, _, err = gantry("pat", "clusters", "label", "site-b", f"{imagenet}-")
    assert code == 0, err
    assert Cluster.objects.get(name="site-b").labels == {"storage": "ceph", "region": "eu"}
    # bad input: said, and nothing changes
    code, _, err = gantry("pat", "clusters", "label", "site-b", "storage")
    assert code != 0 and "key=value" in err
    code, _, err = gantry("pat", "clusters", "label", "site-b", "bad key=x")
    assert code != 0 and "is not a label key" in err
    assert Cluster.objects.get(name="site-b").labels == {"storage": "ceph", "region": "eu"}
    code, _, err = gantry("carol", "clusters", "label", "site-b", "storage=nfs")
    assert code != 0
    assert Cluster.objects.get(name="site-b").labels["storage"] == "ceph"
