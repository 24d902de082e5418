"""A platform admin cordons a node from the Nodes page and sees it cordoned (issue 20), with
screenshots of the inventory and of one node."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.utils import timezone
from playwright.sync_api import expect

from scheduler.agent.xids import FATAL_XIDS
from scheduler.models import AllocationDevice, GpuDevice, JobState, Node, XidEvent
from tenants.models import AuditEntry
from tests import factories as f
from tests.conftest import Org
from tests.portal.browser.conftest import shoot

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def rack(org: Org) -> Node:
    """Four nodes in two pools, one with a GPU lost to an XID and one NotReady, and jobs of
    two teams on the first; returns the first."""
    nodes = []
    for name, pool, flavor, domain in [
        ("dgx-h100-01", "training", "H100-80GB", "nvl-a"),
        ("dgx-h100-02", "training", "H100-80GB", "nvl-a"),
        ("hgx-a100-01", "inference", "A100-40GB", "nvl-b"),
        ("hgx-a100-02", "inference", "A100-40GB", "nvl-b"),
    ]:
        labels = {"gantry.io/nvlink-domain": domain, "nvidia.com/mig.strategy": "none"}
        if name == "hgx-a100-02":
            labels.update(
                {"nvidia.com/mig.strategy": "mixed", "nvidia.com/mig.config": "all-balanced"}
            )
        node = f.NodeFactory(name=name, pool=pool, flavor=flavor, labels=labels,
                             driver_version="550.54.15", ready=name != "dgx-h100-02")  # fmt: skip
        memory = 81920 if flavor.startswith("H100") else 40960
        for index in range(8):
            GpuDevice.objects.create(node=node, index=index, uuid=f"GPU-{name}-{index}",
                                     model=flavor, memory_mib=memory, utilization_pct=87.0,
                                     temperature_c=61.0, memory_used_mib=52000)  # fmt: skip
        nodes.append(node)
    GpuDevice.objects.filter(node=nodes[2], index=3).update(
        healthy=False, health_reason="XID 79", xid_errors=[79]
    )
    now = timezone.now()
    for node, index, code, hours in [(nodes[2], 3, 79, 1), (nodes[0], 5, 13, 2),
                                     (nodes[0], 2, 94, 30)]:  # fmt: skip
        XidEvent.objects.create(node=node, device=node.devices.get(index=index), code=code,
                                uuid=f"GPU-{node.name}-{index}", fatal=code in FATAL_XIDS,
                                seen_at=now - timedelta(hours=hours))  # fmt: skip
    first = nodes[0]
    for project, name, replicas in [(org.proj_alpha, "llama-pretrain", 4),
                                    (org.proj_bravo, "bert-finetune", 2)]:  # fmt: skip
        job = f.JobFactory(project=project, name=name, state=JobState.RUNNING,
                           gpus_per_replica=1, gpu_milli_per_replica=1000)  # fmt: skip
        taken = AllocationDevice.objects.filter(device__node=first).count()
        for replica in range(replicas):
            allocation = f.AllocationFactory(job=job, node=first, replica=replica)
            device = first.devices.get(index=taken + replica)
            AllocationDevice.objects.create(allocation=allocation, device=device, milli=1000)
    return first


def test_platform_admin_cordons_a_node_from_the_nodes_page(org: Org, page_for: Any) -> None:
    node = rack(org)
    pat = page_for("pat")
    pat.click("nav >> text=Nodes")
    row = pat.locator("#node-table tr[data-node='dgx-h100-01']")
    expect(row).to_contain_text("2 / 8")
    expect(row).to_contain_text("healthy")
    expect(pat.locator("#node-table tr[data-node='hgx-a100-01']")).to_contain_text("unhealthy")
    expect(pat.locator("#node-table tr[data-node='hgx-a100-01'] td[data-xids]")).to_have_text("1")
    shoot(pat, "nodes")
    row.locator("a", has_text="dgx-h100-01").click()
    expect(pat.locator("#node-xids tr[data-xid]")).to_have_count(2)
    expect(pat.locator("#node-xids")).to_contain_text("graphics engine exception")
    expect(pat.locator("#node-allocations")).to_contain_text("llama-pretrain")
    expect(pat.locator("#node-allocations")).to_contain_text("team-bravo")
    pat.fill("#node-actions input[name=reason]", "fan replacement")
    pat.click("#node-actions button[value=cordon]")
    expect(pat.locator(".flash-success")).to_contain_text("Node dgx-h100-01 cordoned")
    expect(pat.locator("#node-schedulable")).to_contain_text("cordoned")
    expect(pat.locator("#node-schedulable")).to_contain_text("fan replacement")
    shoot(pat, "node-detail")
    node.refresh_from_db()
    assert node.cordoned and node.cordon_reason == "fan replacement"
    assert AuditEntry.objects.filter(action="node.cordon", actor_name="pat").count() == 1
    pat.click("nav >> text=Nodes")
    expect(pat.locator("#node-table tr[data-node='dgx-h100-01']")).to_contain_text("cordoned")
