"""The Nodes pages (issue 20, Dashboards "Nodes"): platform admins see the inventory, one
node's devices, XIDs and what runs there, and cordon, drain, uncordon and heal from the page
through the node services (audited as the API is); everyone else gets a 404."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.test import Client
from django.urls import reverse
from django.utils import timezone

from scheduler.agent.xids import FATAL_XIDS
from scheduler.models import AllocationDevice, GpuDevice, JobState, Node, XidEvent
from tenants.models import AuditEntry
from tests import factories as f
from tests.conftest import Org


def make_node(name: str, *, gpus: int = 4, pool: str = "default", **fields: Any) -> Node:
    labels = {"gantry.io/nvlink-domain": f"nvl-{name}", "nvidia.com/mig.strategy": "mixed",
              "nvidia.com/mig.config": "all-1g.10gb"}  # fmt: skip
    node = f.NodeFactory(name=name, pool=pool, labels=labels, **fields)
    for index in range(gpus):
        GpuDevice.objects.create(node=node, index=index, uuid=f"GPU-{name}-{index}",
                                 model=node.flavor, memory_mib=81920)  # fmt: skip
    return node


def run_on(org: Org, node: Node, *, milli: int = 1000, name: str = "trainer") -> Any:
    """A running job of team-alpha holding device 0 of `node` (`milli` of it)."""
    job = f.JobFactory(project=org.proj_alpha, name=name, state=JobState.RUNNING,
                       gpu_milli_per_replica=milli)  # fmt: skip
    allocation = f.AllocationFactory(job=job, node=node)
    AllocationDevice.objects.create(allocation=allocation, device=node.devices.get(index=0),
                                    milli=milli)  # fmt: skip
    return job


def page(client: Client, url: str, **query: Any) -> str:
    response = client.get(url, query)
    assert response.status_code == 200, response.status_code
    return response.content.decode()


# --- who sees the pages --------------------------------------------------------------------


@pytest.mark.parametrize("persona", ["alice", "tina", "dana", "carol"])
def test_nodes_pages_are_404_for_everyone_but_platform_admins(
    org: Org, web_for: Any, persona: str
) -> None:
    node = make_node("gpu-a")
    client = web_for(persona)
    assert client.get(reverse("portal:nodes")).status_code == 404
    assert client.get(reverse("portal:node-detail", args=[node.pk])).status_code == 404
    action = reverse("portal:node-action", args=[node.pk])
    assert client.post(action, {"action": "cordon"}).status_code == 404
    assert not Node.objects.get(pk=node.pk).cordoned
    assert ">Nodes</a>" not in page(client, reverse("portal:home"))


def test_unknown_node_is_404_for_a_platform_admin(org: Org, web_for: Any) -> None:
    client = web_for("pat")
    assert client.get(reverse("portal:node-detail", args=[999999])).status_code == 404
    response = client.post(reverse("portal:node-action", args=[999999]), {"action": "cordon"})
    assert response.status_code == 404


# --- the inventory -------------------------------------------------------------------------


def test_inventory_shows_model_memory_mig_nvlink_health_and_free_gpus(
    org: Org, web_for: Any
) -> None:
    busy = make_node("gpu-busy")
    run_on(org, busy)
    sick = make_node("gpu-sick", pool="spot", flavor="A100-40GB", gpus=2)
    GpuDevice.objects.filter(node=sick, index=1).update(healthy=False, health_reason="XID 79")
    make_node("gpu-down", ready=False, cordoned=True, cordoned_by="daemon")
    text = page(web_for("pat"), reverse("portal:nodes"))
    assert ">Nodes</a>" in text  # in the navigation
    row = text.split('data-node="gpu-busy"')[1].split("</tr>")[0]
    for shown in ["default", "H100-80GB", "81920 MiB", "mixed / all-1g.10gb", "nvl-gpu-busy",
                  "healthy", "3 / 4", ">1<"]:  # fmt: skip
        assert shown in row, (shown, row)
    sick_row = text.split('data-node="gpu-sick"')[1].split("</tr>")[0]
    assert "unhealthy" in sick_row and "1 GPU" in sick_row and "1 / 2" in sick_row
    down_row = text.split('data-node="gpu-down"')[1].split("</tr>")[0]
    assert "not ready" in down_row and "cordoned" in down_row


@pytest.mark.parametrize(
    ("query", "shown"),
    [
        ({"pool": "spot"}, {"gpu-sick"}),
        ({"model": "A100-40GB"}, {"gpu-sick"}),
        ({"health": "unhealthy"}, {"gpu-sick"}),
        ({"health": "not ready"}, {"gpu-down"}),
        ({"health": "healthy"}, {"gpu-busy"}),
        ({"schedulable": "no"}, {"gpu-down"}),
        ({"schedulable": "yes"}, {"gpu-busy", "gpu-sick"}),
    ],
    ids=["pool", "model", "unhealthy", "not-ready", "healthy", "cordoned", "schedulable"],
)
def test_inventory_filters(org: Org, web_for: Any, query: dict[str, str], shown: set[str]) -> None:
    make_node("gpu-busy")
    sick = make_node("gpu-sick", pool="spot", flavor="A100-40GB", gpus=2)
    GpuDevice.objects.filter(node=sick, index=1).update(healthy=False)
    make_node("gpu-down", ready=False, cordoned=True)
    text = page(web_for("pat"), reverse("portal:nodes"), **query)
    names = ("gpu-busy", "gpu-sick", "gpu-down")
    listed = {name for name in names if f'data-node="{name}"' in text}
    assert listed == shown


def test_inventory_refuses_an_unknown_filter_value(org: Org, web_for: Any) -> None:
    make_node("gpu-a")
    response = web_for("pat").get(reverse("portal:nodes"), {"health": "purple"})
    assert response.status_code == 400
    text = response.content.decode()
    assert 'id="node-filter-error"' in text and 'data-node="gpu-a"' in text


def test_inventory_is_paginated(org: Org, web_for: Any) -> None:
    for number in range(55):
        f.NodeFactory(name=f"n-{number:03}")
    first = page(web_for("pat"), reverse("portal:nodes"))
    assert 'data-node="n-049"' in first and 'data-node="n-050"' not in first
    assert "Page 1 of 2" in first
    second = page(web_for("pat"), reverse("portal:nodes"), page=2)
    assert 'data-node="n-050"' in second and 'data-node="n-000"' not in second


# --- one node --------------------------------------------------------------------------------


def test_node_page_shows_devices_xids_and_what_runs_there(org: Org, web_for: Any) -> None:
    node = make_node("gpu-a", gpus=2)
    GpuDevice.objects.filter(node=node, index=1).update(
        healthy=False, health_reason="XID 79", xid_errors=[13, 79], ecc_uncorrected=2
    )
    job = run_on(org, node, milli=500, name="notebook")
    text = page(web_for("pat"), reverse("portal:node-detail", args=[node.pk]))
    devices = text.split('id="node-devices"')[1].split("</section>")[0]
    assert "XID 79" in devices and "13, 79" in devices
    runs = text.split('id="node-allocations"')[1].split("</section>")[0]
    assert f"#{job.pk}" in runs and "notebook" in runs and "team-alpha" in runs
    assert "GPU 0 (0.5)" in runs
    assert "mixed / all-1g.10gb" in text and "nvl-gpu-a" in text


def xid(node: Node, index: int, code: int, hours_ago: float) -> XidEvent:
    return XidEvent.objects.create(
        node=node, device=node.devices.get(index=index), uuid=f"GPU-{index}", code=code,
        fatal=code in FATAL_XIDS, seen_at=timezone.now() - timedelta(hours=hours_ago),
    )  # fmt: skip


def test_node_page_shows_the_xid_history_newest_first(org: Org, web_for: Any) -> None:
    node = make_node("gpu-a", gpus=2)
    xid(node, 1, 48, hours_ago=30)
    xid(node, 0, 13, hours_ago=2)
    xid(node, 1, 79, hours_ago=1)
    xid(node, 0, 4242, hours_ago=0.5)  # not in the catalogue's list: no meaning
    text = page(web_for("pat"), reverse("portal:node-detail", args=[node.pk]))
    table = text.split('id="node-xids"')[1].split("</section>")[0]
    rows = [row.split("</tr>")[0] for row in table.split("<tr data-xid=")[1:]]
    assert [row.split('"')[1] for row in rows] == ["4242", "79", "13", "48"]
    assert "GPU has fallen off the bus" in rows[1] and "fatal" in rows[1]
    assert "graphics engine exception" in rows[2] and "fatal" not in rows[2]
    assert "double-bit ECC error" in rows[3] and "—" in rows[0]


def test_node_page_says_when_no_xid_was_recorded(org: Org, web_for: Any) -> None:
    node = make_node("gpu-a", gpus=1)
    xid(make_node("gpu-b", gpus=1), 0, 79, hours_ago=1)  # another node's
    text = page(web_for("pat"), reverse("portal:node-detail", args=[node.pk]))
    table = text.split('id="node-xids"')[1].split("</section>")[0]
    assert "No XID errors recorded." in table and "data-xid=" not in table


def test_inventory_counts_each_nodes_xids_of_the_last_day(org: Org, web_for: Any) -> None:
    noisy, quiet = make_node("gpu-noisy", gpus=2), make_node("gpu-quiet", gpus=2)
    for index, hours in [(0, 1), (1, 23), (1, 25)]:
        xid(noisy, index, 79, hours_ago=hours)
    xid(quiet, 0, 13, hours_ago=48)
    text = page(web_for("pat"), reverse("portal:nodes"))
    counts = {name: text.split(f'data-node="{name}"')[1].split("data-xids=")[1].split('"')[1]
              for name in ("gpu-noisy", "gpu-quiet")}  # fmt: skip
    assert counts == {"gpu-noisy": "2", "gpu-quiet": "0"}


# --- actions ---------------------------------------------------------------------------------


def act(client: Client, node: Node, **body: str) -> Any:
    return client.post(reverse("portal:node-action", args=[node.pk]), body, follow=True)


def test_cordon_from_the_page_is_audited_like_the_api(org: Org, web_for: Any) -> None:
    node = make_node("gpu-a")
    response = act(web_for("pat"), node, action="cordon", reason="bad fan")
    node.refresh_from_db()
    assert (node.cordoned, node.cordoned_by, node.cordon_reason) == (True, "admin", "bad fan")
    assert "Node gpu-a cordoned" in response.content.decode()
    entry = AuditEntry.objects.get(action="node.cordon")
    assert entry.actor == org.users["pat"]


def test_drain_asks_for_confirmation_first(org: Org, web_for: Any) -> None:
    node = make_node("gpu-a")
    job = run_on(org, node)
    client = web_for("pat")
    asked = act(client, node, action="drain", reason="swap GPU 3")
    text = asked.content.decode()
    assert asked.status_code == 200 and 'id="drain-confirm"' in text and f"#{job.pk}" in text
    node.refresh_from_db()
    assert not node.drain_requested and not node.cordoned
    done = act(client, node, action="drain", reason="swap GPU 3", confirm="on")
    node.refresh_from_db()
    assert node.drain_requested and node.cordoned and node.cordon_reason == "swap GPU 3"
    assert "draining" in done.content.decode()
    assert AuditEntry.objects.filter(action="node.drain").count() == 1


def test_uncordon_of_a_not_ready_node_shows_the_error_not_a_500(org: Org, web_for: Any) -> None:
    node = make_node("gpu-a", ready=False, cordoned=True, cordoned_by="admin")
    response = act(web_for("pat"), node, action="uncordon")
    assert response.status_code == 200
    assert "Could not uncordon node gpu-a" in response.content.decode()
    assert "NotReady" in response.content.decode()
    node.refresh_from_db()
    assert node.cordoned


def test_uncordon_and_heal(org: Org, web_for: Any) -> None:
    node = make_node("gpu-a", cordoned=True, cordoned_by="admin", sim_failed=True)
    GpuDevice.objects.filter(node=node).update(healthy=False, health_reason="XID 48")
    client = web_for("pat")
    healed = act(client, node, action="heal")
    assert "healed" in healed.content.decode()
    assert not GpuDevice.objects.filter(node=node, healthy=False).exists()
    node.refresh_from_db()
    assert not node.sim_failed
    act(client, node, action="uncordon")
    node.refresh_from_db()
    assert not node.cordoned
    assert {"node.heal", "node.gpu_heal", "node.uncordon"} <= set(
        AuditEntry.objects.values_list("action", flat=True)
    )


@pytest.mark.parametrize(
    "body",
    [{"action": "reboot"}, {}, {"action": "cordon", "reason": "x" * 301}],
    ids=["unknown-action", "no-action", "reason-too-long"],
)
def test_bad_action_input_is_a_400_and_changes_nothing(
    org: Org, web_for: Any, body: dict[str, str]
) -> None:
    node = make_node("gpu-a")
    response = web_for("pat").post(reverse("portal:node-action", args=[node.pk]), body)
    assert response.status_code == 400
    assert 'id="node-action-error"' in response.content.decode()
    node.refresh_from_db()
    assert not node.cordoned and not AuditEntry.objects.filter(action__startswith="node.").exists()


def test_actions_need_the_csrf_token(org: Org) -> None:
    node = make_node("gpu-a")
    client = Client(enforce_csrf_checks=True)
    client.force_login(org.users["pat"])
    response = client.post(reverse("portal:node-action", args=[node.pk]), {"action": "cordon"})
    assert response.status_code == 403
    node.refresh_from_db()
    assert not node.cordoned


# --- queries -----------------------------------------------------------------------------------


def test_inventory_queries_do_not_grow_with_nodes(
    org: Org, web_for: Any, django_assert_num_queries: Any
) -> None:
    for number in range(30):
        node = make_node(f"gpu-{number:02}", gpus=2)
        run_on(org, node, name=f"job-{number}")
        xid(node, 1, 79, hours_ago=1)
    client = web_for("pat")
    client.get(reverse("portal:nodes"))  # warm per-request caches such as the session
    # session, user, grants (2), clusters, pools, models, count, page
    with django_assert_num_queries(9):
        response = client.get(reverse("portal:nodes"))
    assert response.status_code == 200 and response.content.decode().count("data-node=") == 30


def test_node_page_queries_do_not_grow_with_allocations(
    org: Org, web_for: Any, django_assert_num_queries: Any
) -> None:
    node = make_node("gpu-a", gpus=8)
    for index in range(8):
        job = f.JobFactory(project=org.proj_alpha, state=JobState.RUNNING)
        allocation = f.AllocationFactory(job=job, node=node)
        device = node.devices.get(index=index)
        AllocationDevice.objects.create(allocation=allocation, device=device, milli=1000)
    client = web_for("pat")
    url = reverse("portal:node-detail", args=[node.pk])
    for index in range(8):
        xid(node, index, 79, hours_ago=index)
    client.get(url)
    # session, user, grants (2), node, devices, allocations, their device shares, XIDs
    with django_assert_num_queries(9):
        response = client.get(url)
    assert response.status_code == 200 and response.content.decode().count("GPU 7") == 1
