"""Fragmentation: free GPUs that not one replica of any queued job could use where they lie
(scheduler/metrics/fragmentation.py)."""

from __future__ import annotations

from typing import Any

import pytest

from scheduler.metrics.fragmentation import Demand, demand_by_flavor, fragmented_milli
from scheduler.models import GpuDevice, JobState, Node
from tests import factories as f
from tests.conftest import Org
from tests.metrics.helpers import TOKEN, scrape, value

H100, A100 = "H100-80GB", "A100-40GB"
# Node 1: two whole devices free and one half free; node 2: one whole free and a quarter.
FREE = [(1, H100, 1000), (1, H100, 1000), (1, H100, 500), (2, H100, 1000), (2, H100, 250)]


@pytest.mark.parametrize(
    ("demand", "stranded"),
    [
        # Two whole GPUs per replica: node 1's whole pair serves; node 2's lone whole device,
        # and every partial share, do not: 1000 + 500 + 250.
        pytest.param(Demand(whole=2), 1750, id="whole-pairs"),
        # One whole GPU: every whole device serves; the partial shares do not.
        pytest.param(Demand(whole=1), 750, id="whole-singles"),
        # Half a GPU: whole devices and the half serve; the quarter does not.
        pytest.param(Demand(share=500), 250, id="halves"),
        # Pairs or halves: only the quarter is stranded.
        pytest.param(Demand(whole=2, share=500), 250, id="pairs-or-halves"),
        # Four whole GPUs per replica: no node has four whole: everything is stranded.
        pytest.param(Demand(whole=4), 3750, id="too-big-everywhere"),
    ],
)
def test_stranded_capacity(demand: Demand, stranded: int) -> None:
    total, fragmented = fragmented_milli(FREE, {H100: demand})
    assert total == {H100: 3750}
    assert fragmented.get(H100, 0) == stranded


def test_nobody_waiting_strands_nothing() -> None:
    """Idle GPUs are not fragmented: with no queued job of the flavor there is nothing they
    are kept from."""
    total, fragmented = fragmented_milli(FREE, {})
    assert total == {H100: 3750} and fragmented == {}


def test_demand_takes_the_smallest_asks_per_allowed_flavor() -> None:
    shapes = [(4000, [H100]), (2000, []), (500, [A100]), (250, ["T4"])]  # T4: no such nodes
    assert demand_by_flavor(shapes, {H100, A100}) == {
        H100: Demand(whole=2),  # the 4-GPU job and the any-flavor 2-GPU job
        A100: Demand(whole=2, share=500),
    }


def test_scrape_reports_free_and_fragmented_gpus(org: Org, settings: Any) -> None:
    """The table's first case through the database: cordoned nodes and unhealthy devices
    do not count as free; A100s nobody waits for are free but not fragmented."""
    settings.GANTRY_METRICS_TOKEN = TOKEN

    def node(name: str, flavor: str, allocated: list[int], **fields: Any) -> Node:
        made = f.NodeFactory(name=name, flavor=flavor, **fields)
        for index, milli in enumerate(allocated):
            GpuDevice.objects.create(node=made, index=index, model=flavor)
            GpuDevice.objects.filter(node=made, index=index).update(allocated_milli=milli)
        return made

    node("n1", H100, [0, 0, 500, 1000])
    node("n2", H100, [0, 750])
    node("n3", H100, [0, 0], cordoned=True)
    sick = node("n4", H100, [0, 0])
    GpuDevice.objects.filter(node=sick).update(healthy=False)
    node("n5", A100, [0])
    f.JobFactory(project=org.proj_alpha, submitted_by=org.users["alice"], flavors=[H100],
                 gpus_per_replica=2, gpu_milli_per_replica=2000, replicas=3)  # fmt: skip
    f.JobFactory(project=org.proj_alpha, submitted_by=org.users["alice"], state=JobState.RUNNING,
                 gpus_per_replica=0, gpu_milli_per_replica=250)  # fmt: skip
    text = scrape()
    assert value(text, "gantry_gpus_free", flavor=H100) == 3.75
    assert value(text, "gantry_gpus_fragmented", flavor=H100) == 1.75
    assert value(text, "gantry_gpus_free", flavor=A100) == 1
    assert value(text, "gantry_gpus_fragmented", flavor=A100) == 0
