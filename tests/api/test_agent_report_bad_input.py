"""POST /api/v1/nodes/report/ with bad input (issue 20, "Bad input and faults"): each case
is refused with a clear 4xx that writes nothing, or absorbed without doubling the history.

Covered elsewhere: a device the cluster does not list and a token bound to another node
(tests/api/test_node_agent.py), a burst of reports (tests/scheduler/test_utilization.py::
test_an_agent_report_is_one_sample_per_device_attributed_and_bursts_absorbed), `power_w`
out of range (test_an_agent_report_out_of_range_is_refused_and_writes_no_sample).
"""

from __future__ import annotations

import json
from datetime import timedelta
from typing import Any

import pytest
from django.test import Client
from django.utils import timezone

from scheduler.models import GpuDevice, Node, UtilizationSample
from tests.api.test_node_agent import URL, agent_client, body, make_node, post, reading
from tests.conftest import Org


@pytest.fixture
def node(org: Org) -> Node:
    return make_node("gpu-a")


def nothing_written(node: Node) -> None:
    assert not UtilizationSample.objects.exists()
    assert not GpuDevice.objects.filter(node=node, reported_at__isnull=False).exists()
    assert Node.objects.get(pk=node.pk).last_report_at is None


def admin(org: Org) -> Client:
    client = Client()
    client.force_login(org.users["pat"])
    return client


def test_a_report_for_a_node_the_cluster_does_not_list_is_404(org: Org, node: Node) -> None:
    response = post(admin(org), body("gpu-zz", reading(0)))
    assert response.status_code == 404
    assert "unknown node 'gpu-zz'" in response.json()["detail"]
    # An agent whose credential was made before the cluster listed its node: the same.
    response = post(agent_client("gpu-new"), body("gpu-new", reading(0)))
    assert response.status_code == 404
    assert not Node.objects.filter(name__in=["gpu-zz", "gpu-new"]).exists()
    nothing_written(node)


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("utilization_pct", 100.5),
        ("utilization_pct", -1),
        ("temperature_c", 500),
        ("memory_used_mib", -1),
        ("power_w", 6000),
        ("sm_active_pct", 101),
        ("ecc_uncorrected", -2),
        ("index", 256),
        ("xid_errors", [-1]),
        ("utilization_pct", "NaN"),  # a string where a number belongs
        ("utilization_pct", "50"),
    ],
)
def test_out_of_range_or_mistyped_values_are_refused(
    org: Org, node: Node, field: str, value: Any
) -> None:
    gpu = {**reading(0), field: value}
    response = post(agent_client("gpu-a"), body("gpu-a", gpu))
    assert response.status_code == 400, response.json()
    assert field in json.dumps(response.json()["errors"])
    nothing_written(node)


@pytest.mark.parametrize("literal", ["NaN", "Infinity", "-Infinity"])
def test_non_finite_numbers_are_refused(org: Org, node: Node, literal: str) -> None:
    text = json.dumps(body("gpu-a", reading(0))).replace(
        '"utilization_pct": 50.0', f'"utilization_pct": {literal}'
    )
    assert literal in text
    response = agent_client("gpu-a").post(URL, text, content_type="application/json")
    assert response.status_code == 400
    nothing_written(node)


def test_more_memory_used_than_the_device_has_is_refused(org: Org, node: Node) -> None:
    gpu = {**reading(0), "memory_total_mib": 81559, "memory_used_mib": 81560}
    response = post(agent_client("gpu-a"), body("gpu-a", gpu))
    assert response.status_code == 400
    assert "memory_used_mib" in json.dumps(response.json()["errors"])
    nothing_written(node)


def test_a_device_reported_twice_in_one_report_is_refused(org: Org, node: Node) -> None:
    """Two readings of device 0 would write two samples of it at one instant (a doubled
    history) and leave the device with whichever came last."""
    response = post(agent_client("gpu-a"), body("gpu-a", reading(0), reading(1), reading(0)))
    assert response.status_code == 400
    assert "GPU index 0 is reported twice" in json.dumps(response.json()["errors"])
    nothing_written(node)


def test_a_report_older_than_the_devices_last_adds_no_sample(org: Org, node: Node) -> None:
    """Reports carry no time of their own: a sample is stamped with the server's clock. Two
    web servers whose clocks differ can take a device's reports out of time order; the one
    that lands before the device's last report (by the server's clock) updates nothing of
    the history: samples stay in time order, one per interval."""
    client = agent_client("gpu-a")
    assert post(client, body("gpu-a", reading(0))).status_code == 200
    assert UtilizationSample.objects.count() == 1
    ahead = timezone.now() + timedelta(minutes=5)  # the other server's clock is ahead
    GpuDevice.objects.filter(node=node, index=0).update(reported_at=ahead)
    UtilizationSample.objects.update(at=ahead)
    assert post(client, body("gpu-a", reading(0))).status_code == 200
    assert list(UtilizationSample.objects.values_list("at", flat=True)) == [ahead]
