"""/api/v1/clusters/: who reads and who writes, validation with what was wrong (and nothing
changed), the inventory and use per cluster, pagination; the nodes filtered by cluster."""

from __future__ import annotations

from typing import Any

import pytest

from scheduler.backends.base import GpuInfo, NodeInfo
from scheduler.models import Cluster, GpuDevice
from scheduler.nodes.services import node_sync
from tenants.models import AuditEntry

pytestmark = pytest.mark.django_db
URL = "/api/v1/clusters/"
B = {
    "name": "site-b",
    "backend": "kubernetes",
    "kubeconfig_secret": "site-b",
    "labels": {"region": "eu"},
}


def _info(name: str, gpus: int, **labels: str) -> NodeInfo:
    devices = tuple(GpuInfo(i, 81920) for i in range(gpus))
    return NodeInfo(name, "H100-80GB", devices, 64_000, 1 << 19, labels=labels)


def test_a_platform_admin_adds_a_cluster_and_everyone_who_reads_nodes_sees_it(
    org: Any, client_for: Any
) -> None:
    made = client_for("pat").post(URL, B, format="json")
    assert made.status_code == 201, made.json()
    assert made.json()["name"] == "site-b" and made.json()["state"] == "active"
    assert AuditEntry.objects.filter(action="cluster.create").count() == 1
    for reader in ("pat", "carol", "tina", "dana"):
        names = [c["name"] for c in client_for(reader).get(URL).json()["results"]]
        assert names == ["local", "site-b"], reader
    assert client_for("alice").get(URL).json()["results"] == []
    assert client_for("alice").get(f"{URL}{made.json()['id']}/").status_code == 404


@pytest.mark.parametrize("persona", ["carol", "dana", "tina"])
def test_readers_may_not_write(org: Any, client_for: Any, persona: str) -> None:
    home = Cluster.objects.get(home=True)
    client = client_for(persona)
    assert client.post(URL, B, format="json").status_code == 403
    assert (
        client.patch(f"{URL}{home.pk}/", {"labels": {"region": "x"}}, format="json").status_code
        == 403
    )
    assert client.post(f"{URL}{home.pk}/cordon/").status_code == 403
    assert client.delete(f"{URL}{home.pk}/").status_code == 403
    assert list(Cluster.objects.values_list("name", "state", "labels")) == [("local", "active", {})]


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({**B, "name": "Site B"}, "name"),
        ({**B, "backend": "slurm"}, "backend"),
        ({**B, "labels": {"zone a": "x"}}, "labels"),
        ({**B, "labels": {"region": "EU West"}}, "labels"),
        ({**B, "labels": {"data.example.com/imagenet": "-yes"}}, "labels"),
        ({**B, "token": "abc"}, "token"),
        ({**B, "kubeconfig_secret": "", "kubeconfig_path": "relative"}, "kubeconfig_path"),
        ({**B, "lost_after_s": 1}, "lost_after_s"),
        ({**B, "name": 7}, "name"),
    ],
    ids=[
        "name",
        "backend",
        "label-key",
        "region-value",
        "label-value",
        "credential",
        "relative-path",
        "deadline",
        "int-name",
    ],
)
def test_bad_input_is_a_400_naming_the_field_and_changes_nothing(
    org: Any, client_for: Any, body: dict[str, Any], field: str
) -> None:
    answer = client_for("pat").post(URL, body, format="json")
    assert answer.status_code == 400, answer.json()
    assert field in str(answer.json()["errors"]), answer.json()
    assert Cluster.objects.count() == 1


def test_a_taken_name_is_a_409(org: Any, client_for: Any) -> None:
    answer = client_for("pat").post(URL, {"name": "local", "backend": "simulated"}, format="json")
    assert answer.status_code == 409


def test_update_cordon_uncordon_and_delete(org: Any, client_for: Any) -> None:
    pat = client_for("pat")
    made = pat.post(URL, B, format="json").json()
    url = f"{URL}{made['id']}/"
    changed = pat.patch(
        url, {"labels": {"region": "us", "site": "s2"}, "lost_after_s": 120}, format="json"
    )
    assert changed.status_code == 200, changed.json()
    assert (changed.json()["labels"], changed.json()["lost_after_s"]) == (
        {"region": "us", "site": "s2"},
        120,
    )
    assert pat.patch(url, {"name": "other"}, format="json").status_code == 400
    assert pat.post(f"{url}cordon/").json()["state"] == "cordoned"
    assert pat.post(f"{url}uncordon/", {"force": True}, format="json").status_code == 400
    assert pat.post(f"{url}uncordon/").json()["state"] == "active"
    assert pat.delete(url).status_code == 204
    assert pat.delete(f"{URL}{Cluster.objects.get(home=True).pk}/").status_code == 409


def test_each_cluster_shows_its_nodes_gpus_and_use(
    org: Any, client_for: Any, django_assert_max_num_queries: Any
) -> None:
    client_for("pat").post(URL, B, format="json")
    node_sync([_info("h1", 8), _info("site-b:n1", 4, **{"gantry.io/cluster": "site-b"})])
    GpuDevice.objects.filter(node__name="site-b:n1", index__in=[0, 1]).update(allocated_milli=1000)
    client = client_for("carol")
    with django_assert_max_num_queries(12):
        rows = {c["name"]: c for c in client.get(URL).json()["results"]}
    assert (rows["local"]["nodes"], rows["local"]["gpus"], rows["local"]["gpus_allocated"]) == (
        1,
        8,
        0,
    )
    # 2 of 4 GPUs allocated: utilization 0.5
    assert (rows["site-b"]["nodes"], rows["site-b"]["gpus"], rows["site-b"]["utilization"]) == (
        1,
        4,
        0.5,
    )


def test_the_list_is_paginated_and_filtered(org: Any, client_for: Any) -> None:
    for i in range(3):
        Cluster.objects.create(
            name=f"c{i}", backend="simulated", state="cordoned" if i else "active"
        )
    client = client_for("pat")
    page = client.get(f"{URL}?page_size=2").json()
    assert page["count"] == 4 and len(page["results"]) == 2 and page["next"]
    assert [c["name"] for c in client.get(f"{URL}?state=cordoned").json()["results"]] == [
        "c1",
        "c2",
    ]


def test_the_nodes_are_filtered_by_cluster(org: Any, client_for: Any) -> None:
    b = Cluster.objects.create(name="site-b", backend="simulated")
    node_sync([_info("h1", 8), _info("site-b:n1", 4, **{"gantry.io/cluster": "site-b"})])
    nodes = client_for("pat").get(f"/api/v1/nodes/?cluster={b.pk}").json()["results"]
    assert [(n["name"], n["cluster"]) for n in nodes] == [("site-b:n1", "site-b")]
