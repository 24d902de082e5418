"""Start estimates over several clusters (issue 38): the replay runs the engine, so the
one-cluster rule and quotas pinned to a cluster hold in the estimate as in the daemon."""

from __future__ import annotations

from dataclasses import replace

import pytest

from scheduler.core.clusters import CLUSTER_LABEL
from scheduler.core.quota import pinned_key
from scheduler.core.types import Node, Quota, Tenant
from scheduler.sim import estimate_starts
from tests.scheduler.core.builders import BEST_FIT, make_job, make_node, make_running, snapshot


def node(name: str) -> Node:
    return replace(make_node(name, 8), labels={CLUSTER_LABEL: name.split(":")[0]})


# Each cluster's node has 4 of 8 GPUs free: a's job ends at 300, b's at 600.
NODES = [node("a:1"), node("b:1")]
RUNNING = [
    make_running(make_job("on-a", "team-b", gpus=4, runtime=300), ("a:1", range(4))),
    make_running(make_job("on-b", "team-b", gpus=4, runtime=600), ("b:1", range(4))),
]


@pytest.mark.parametrize(
    ("pins", "expected"),
    [
        # 4 + 4 GPUs are free now, but in two clusters: the gang starts when a empties
        ({}, 300.0),
        # team-a may use nothing on a: it waits for b
        ({pinned_key("H100", "a"): Quota(0, 0)}, 600.0),
    ],
    ids=["gang-waits-for-one-cluster", "pinned-limit-sends-it-to-b"],
)
def test_a_gang_is_estimated_to_start_when_one_cluster_holds_it_whole(
    pins: dict[str, Quota], expected: float
) -> None:
    tenants = (
        Tenant("org"),
        Tenant("team-a", "org", {"H100": Quota(16_000, 16_000)}, pinned=pins),
        Tenant("team-b", "org", {"H100": Quota(16_000, 16_000)}),
    )
    gang = make_job("gang", gpus=4, replicas=2, runtime=100)
    snap = snapshot(NODES, [gang], RUNNING, tenants=tenants, now=10.0)
    assert estimate_starts(snap, BEST_FIT, horizon_s=3600) == {"gang": expected}
