"""Each GPU's XID history (issue 20, Dashboards "Nodes": "XID history"), and the one list of
fatal XIDs that the agent and the server share.

Only the XIDs of a device's latest report were kept (`GpuDevice.xid_errors`): an XID that came
and went was lost at the next report. Now every report's XIDs are rows, kept
GANTRY_XID_RETENTION_DAYS. The agent and the server each had their own fatal set and disagreed
(63, 119 and 120 on the agent only; 62, 92 and 94 on the server only).
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.utils import timezone

from scheduler.agent import nvml
from scheduler.agent.xids import FATAL_XIDS
from scheduler.models import GpuDevice, Node, XidEvent
from scheduler.nodes.services import _verdict
from scheduler.telemetry.rollups import retention_run
from tests.api.test_node_agent import agent_client, body, make_node, post, reading
from tests.conftest import Org

# NVIDIA's XID catalogue: a GPU reset or more (scheduler/agent/xids.py says why the others
# are left out).
EXPECTED_FATAL = {48, 62, 64, 74, 79, 95, 119, 120}
# The codes either list held, and application faults that say nothing about the hardware.
CODES = sorted({48, 62, 63, 64, 74, 79, 92, 94, 95, 119, 120, 13, 31, 43, 45})


@pytest.fixture
def node(org: Org) -> Node:
    return make_node("gpu-a", gpus=2)


def history(node: Node) -> list[tuple[int, int, bool]]:
    rows = XidEvent.objects.filter(node=node).order_by("id")
    return [(x.device.index, x.code, x.fatal) for x in rows.select_related("device")]


def test_every_reported_xid_is_kept_once_per_device_and_report(node: Node) -> None:
    client = agent_client("gpu-a")
    response = post(client, body("gpu-a", reading(0, [13, 13, 79]), reading(1, [31])))
    assert response.status_code == 200, response.json()
    # A later report of the same XIDs is new events (XIDs are drained from NVML's event set),
    # counted on the row of the first within GANTRY_XID_COALESCE_S (issue 34, item 8).
    assert post(client, body("gpu-a", reading(0, [13]), reading(1))).status_code == 200
    # Written fatal codes first (the minute's budget goes to them: test_xid_bounds).
    assert history(node) == [(0, 79, True), (0, 13, False), (1, 31, False)]
    counts = XidEvent.objects.order_by("id").values_list("code", "count")
    assert list(counts) == [(79, 1), (13, 2), (31, 1)]
    uuids = set(XidEvent.objects.values_list("uuid", flat=True))
    assert uuids == {"GPU-0", "GPU-1"}  # as the agent reported them
    # The device's own field still holds the latest report only.
    assert GpuDevice.objects.get(node=node, index=0).xid_errors == [13]


def test_a_report_without_xids_writes_no_history(node: Node) -> None:
    assert post(agent_client("gpu-a"), body("gpu-a", reading(0), reading(1))).status_code == 200
    assert not XidEvent.objects.exists()


def test_xid_history_is_kept_for_its_retention(node: Node, settings: Any) -> None:
    settings.GANTRY_XID_RETENTION_DAYS = 90
    now = timezone.now()
    device = GpuDevice.objects.get(node=node, index=0)
    for days in (89, 91):
        XidEvent.objects.create(node=node, device=device, code=79, fatal=True,
                                seen_at=now - timedelta(days=days))  # fmt: skip
    assert retention_run(now=now)["xid"] == 1
    assert [(now - x).days for x in XidEvent.objects.values_list("seen_at", flat=True)] == [89]


def test_one_fatal_list_for_agent_and_server() -> None:
    assert FATAL_XIDS == EXPECTED_FATAL
    assert nvml.FATAL_XIDS is FATAL_XIDS


@pytest.mark.parametrize("code", CODES, ids=[f"xid-{code}" for code in CODES])
def test_the_server_marks_unhealthy_exactly_on_the_fatal_xids(node: Node, code: int) -> None:
    response = post(agent_client("gpu-a"), body("gpu-a", reading(0, [code])))
    assert response.status_code == 200, response.json()
    device = GpuDevice.objects.get(node=node, index=0)
    fatal = code in EXPECTED_FATAL
    assert device.healthy is not fatal
    assert device.health_reason == (f"XID {code}" if fatal else "")
    assert history(node) == [(0, code, fatal)]


def test_the_servers_verdict_is_unhealthy_on_the_fatal_xids_and_no_other_code() -> None:
    # Codes 0..199: the catalogued ones and many that are not; only the fatal ones count.
    unhealthy = {code for code in range(200) if not _verdict({"xid_errors": [code]})[0]}
    assert unhealthy == EXPECTED_FATAL


@pytest.mark.parametrize("code", CODES, ids=[f"xid-{code}" for code in CODES])
def test_the_agent_judges_a_device_by_the_same_list(code: int) -> None:
    gpu = nvml.GpuReading(index=0, uuid="GPU-0", name="H100", memory_total_mib=1,
                          memory_used_mib=0, utilization_pct=0, temperature_c=40,
                          ecc_uncorrected=0, xid_errors=(code,))  # fmt: skip
    assert gpu.healthy is (code not in EXPECTED_FATAL)


def test_node_api_detail_shows_the_xid_history_and_the_list_counts_the_last_day(
    node: Node, client_for: Any
) -> None:
    device = GpuDevice.objects.get(node=node, index=1)
    now = timezone.now()
    for hours, code in [(30, 48), (2, 13), (1, 79)]:
        seen_at = now - timedelta(hours=hours)
        XidEvent.objects.create(node=node, device=device, uuid="GPU-x", code=code,
                                fatal=code in FATAL_XIDS, seen_at=seen_at)  # fmt: skip
    api = client_for("pat")
    detail = api.get(f"/api/v1/nodes/{node.pk}/").json()
    assert [(x["gpu"], x["code"], x["fatal"]) for x in detail["xid_history"]] == [
        (1, 79, True), (1, 13, False), (1, 48, True)
    ]  # fmt: skip
    assert detail["xid_history"][0]["meaning"] == "GPU has fallen off the bus"
    listed = api.get("/api/v1/nodes/").json()["results"]
    assert [(n["name"], n["xids_24h"]) for n in listed] == [("gpu-a", 2)]
    # A coalesced row counts every report it holds.
    XidEvent.objects.filter(code=13).update(count=5)
    listed = api.get("/api/v1/nodes/").json()["results"]
    assert [(n["name"], n["xids_24h"]) for n in listed] == [("gpu-a", 6)]
    detail = api.get(f"/api/v1/nodes/{node.pk}/").json()
    assert [x["count"] for x in detail["xid_history"]] == [1, 5, 1]
