"""An agent's XIDs are bounded and coalesced (issue 34, item 8).

A report may name 64 codes on each of 64 GPUs, every second, and each was a row: one node in an
XID storm (or one compromised agent) wrote 4,096 rows a second. Now a repeat of a (GPU, code)
within GANTRY_XID_COALESCE_S adds to its row's count, and a node writes at most
GANTRY_XID_ROWS_PER_MINUTE new rows in any minute, fatal codes first; the device's health still
follows every reported code.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

import pytest
from django.utils import timezone

from scheduler.agent.xids import FATAL_XIDS
from scheduler.models import GpuDevice, Node, XidEvent
from scheduler.nodes.xids import xids_record
from tests.api.test_node_agent import agent_client, body, make_node, post, reading
from tests.conftest import Org


@pytest.fixture
def node(org: Org, settings: Any) -> Node:
    settings.GANTRY_XID_COALESCE_S = 60
    settings.GANTRY_XID_ROWS_PER_MINUTE = 64
    return make_node("gpu-a", gpus=64)


def storm(codes: range | list[int], gpus: int = 64) -> list[dict[str, Any]]:
    return [{"index": i, "uuid": f"GPU-{i}", "xid_errors": list(codes)} for i in range(gpus)]


def devices(node: Node) -> dict[int, GpuDevice]:
    return {d.index: d for d in GpuDevice.objects.filter(node=node)}


def at(seconds: float) -> datetime:
    return datetime(2026, 12, 1, 12, 0, tzinfo=timezone.get_current_timezone()) + timedelta(
        seconds=seconds
    )


def test_a_storm_of_64_codes_on_64_gpus_writes_at_most_the_minutes_budget(node: Node) -> None:
    """4,096 (GPU, code) pairs a second for a minute: 64 rows in all, the fatal ones first."""
    codes = [*sorted(FATAL_XIDS), *range(200, 256)]  # 8 fatal + 56 others = 64 codes
    first = xids_record(node.pk, devices(node), storm(codes), at(0))
    assert (first.created, first.coalesced, first.dropped) == (64, 0, 4096 - 64)
    # 8 fatal codes x 64 GPUs = 512 fatal pairs: the 64 rows are all fatal ones.
    assert set(XidEvent.objects.values_list("fatal", flat=True)) == {True}
    for second in range(1, 60):
        xids_record(node.pk, devices(node), storm(codes), at(second))
    assert XidEvent.objects.filter(node=node).count() == 64
    # The rows kept are counted at every report that named them again.
    assert set(XidEvent.objects.values_list("count", flat=True)) == {60}


def test_the_budget_frees_as_the_minute_passes(node: Node, settings: Any) -> None:
    settings.GANTRY_XID_ROWS_PER_MINUTE = 4
    xids_record(node.pk, devices(node), storm([13, 31], gpus=3), at(0))  # 6 pairs: 4 rows
    assert XidEvent.objects.count() == 4
    later = xids_record(node.pk, devices(node), storm([13, 31], gpus=3), at(61))
    # Past the coalescing window: new rows again, within a fresh minute's budget.
    assert (later.created, later.coalesced, later.dropped) == (4, 0, 2)
    assert XidEvent.objects.count() == 8


def test_repeats_within_the_window_are_counted_on_one_row(node: Node) -> None:
    for second in (0, 30, 59):
        xids_record(node.pk, devices(node), storm([79], gpus=1), at(second))
    xids_record(node.pk, devices(node), storm([79], gpus=1), at(61))
    rows = list(XidEvent.objects.order_by("seen_at").values_list("seen_at", "count"))
    assert rows == [(at(0), 3), (at(61), 1)]


def test_the_same_code_on_another_gpu_is_its_own_row(node: Node) -> None:
    xids_record(node.pk, devices(node), storm([79], gpus=2), at(0))
    xids_record(node.pk, devices(node), storm([79], gpus=2), at(1))
    rows = XidEvent.objects.order_by("device__index").values_list("device__index", "count")
    assert list(rows) == [(0, 2), (1, 2)]


def test_a_storm_through_the_api_still_marks_every_device(node: Node) -> None:
    """Health follows every reported code, kept in the history or not."""
    gpus = [reading(i, [13, 31, 43, 45, 79]) for i in range(64)]
    response = post(agent_client("gpu-a"), body("gpu-a", *gpus))
    assert response.status_code == 200, response.json()
    assert XidEvent.objects.count() == 64
    assert not GpuDevice.objects.filter(node=node, healthy=True).exists()
    assert set(XidEvent.objects.values_list("code", flat=True)) == {79}
