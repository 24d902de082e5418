"""Whether a job could fit at all, and the wait reason of one that cannot (issue 17, point 12):
the engine names the closest of the allowed flavors, not the first."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from scheduler.core.fit import Capacity, misfit
from scheduler.core.types import Resources, WaitCode
from tests.scheduler.core.builders import (
    BEST_FIT,
    GPU,
    cycle,
    make_job,
    make_node,
    make_running,
    make_tenants,
    snapshot,
)

A100, H100, L40S = "A100-40GB", "H100-80GB", "L40S-48GB"


def mixed_nodes():
    return [
        make_node("a1", 8, A100, gpu_memory_mib=40960),
        make_node("h1", 8, H100, cpu=64_000, memory=524_288),
        make_node("l1", 4, L40S, gpu_memory_mib=49152, rdma=2),
    ]


# (id, resources per replica, gang, flavor, (field, need, most) or None when it fits)
CASES = [
    ("fits", Resources(8 * GPU), 1, H100, None),
    ("too-many-gpus", Resources(16 * GPU), 1, H100, ("gpus", 16, 8)),
    ("share-memory", Resources(500, 200_000), 1, H100, ("gpu_memory_mib", 200_000, 81920)),
    ("share-fits-h100", Resources(500, 60_000), 1, H100, None),
    # GPU memory binds shares only; whole devices are placed by count, as placement does
    ("whole-by-count", Resources(8 * GPU, 200_000), 1, H100, None),
    ("share-not-a100", Resources(500, 60_000), 1, A100, ("gpu_memory_mib", 60_000, 40960)),
    ("cpu", Resources(GPU, 0, 100_000), 1, H100, ("cpu_milli", 100_000, 64_000)),
    ("memory", Resources(GPU, 0, 0, 600_000), 1, H100, ("memory_mib", 600_000, 524_288)),
    ("rdma", Resources(GPU, 0, 0, 0, 4), 1, L40S, ("rdma", 4, 2)),
    # 4 GPUs each: one 8-GPU H100 node holds 2 of the 3
    ("gang", Resources(4 * GPU), 3, H100, ("replicas", 3, 2)),
    # cpu bounds the gang: 64000 / 30000 = 2 replicas on the node
    ("gang-by-cpu", Resources(GPU, 0, 30_000), 3, H100, ("replicas", 3, 2)),
    # a quarter GPU of 20000 MiB: 4 per A100 device by share, 2 by memory: 16 on the node
    ("shares-gang", Resources(250, 20_000), 17, A100, ("replicas", 17, 16)),
    ("no-node", Resources(GPU), 1, "T4", ("flavors", 0, 0)),
]


@pytest.mark.parametrize(
    ("res", "gang", "flavor", "expected"), [c[1:] for c in CASES], ids=[c[0] for c in CASES]
)
def test_misfit(res, gang, flavor, expected):
    nodes = mixed_nodes()
    mask = np.array([n.flavor == flavor for n in nodes])
    found = misfit(Capacity(nodes, today=True), mask, res, gang, flavor)
    assert (None if found is None else (found.field, found.need, found.most)) == expected


def test_a_job_no_node_can_hold_says_so_with_the_closest_flavor():
    # was "no A100-40GB device has 200000 MiB ... the most is 40960", though an H100 has 81920
    job = make_job("j", gpus=0.5, gpu_memory_mib=200_000)
    result = cycle(snapshot(mixed_nodes(), [job]))
    reason = result.reason_for("j")
    assert reason is not None and reason.code == WaitCode.NO_MATCHING_NODE
    assert reason.message == (
        "nothing in the cluster can hold this job today: no H100-80GB node has a GPU with "
        "200000 MiB of GPU memory; the most is 81920 MiB (the closest of A100-40GB, "
        "H100-80GB, L40S-48GB)"
    )


def test_more_gpus_than_any_node_has_is_not_called_fragmentation():
    # was "no node has 16 free L40S-48GB together"; every flavor misses alike: all named
    nodes = [make_node("a1", 8, A100), make_node("h1", 8, H100), make_node("h2", 8, H100)]
    result = cycle(snapshot(nodes, [make_job("j", gpus=16)]))
    reason = result.reason_for("j")
    assert reason is not None
    assert reason.message == (
        "nothing in the cluster can hold this job today: no A100-40GB or H100-80GB node has "
        "16 GPUs; the most on one node is 8"
    )


def test_capacity_reason_skips_a_flavor_that_could_never_hold_the_job():
    # 60000 MiB fits no A100-40GB device; the H100 is busy: the reason is about the H100
    tenants = make_tenants(("team-a", 64, None), ("team-b", 64, None), flavor=H100)
    tenants = tuple(
        t if not t.quotas else type(t)(t.name, t.parent, {**t.quotas, A100: t.quotas[H100]})
        for t in tenants
    )
    busy = make_running(make_job("r", "team-b", gpus=8), ("h1", range(8)), flavor=H100)
    job = make_job("j", gpus=0.5, gpu_memory_mib=60_000, flavors=[A100, H100])
    nodes = [make_node("a1", 8, A100, gpu_memory_mib=40960), make_node("h1", 8, H100)]
    result = cycle(snapshot(nodes, [job], [busy], tenants=tenants))
    reason = result.reason_for("j")
    assert reason is not None and "H100-80GB" in reason.message
    assert "A100-40GB" not in reason.message


def test_capacity_reason_names_the_flavor_with_the_most_free():
    # both flavors could hold 8 GPUs; A100 has 2 free, H100 6: the reason is about the H100
    # (without backfill: a reservation's reason names the flavor it holds devices on)
    tenants = make_tenants(("team-a", 64, None), ("team-b", 64, None), flavor=H100)
    tenants = tuple(
        t if not t.quotas else type(t)(t.name, t.parent, {**t.quotas, A100: t.quotas[H100]})
        for t in tenants
    )
    running = [
        make_running(make_job("ra", "team-b", gpus=6), ("a1", range(6)), flavor=A100),
        make_running(make_job("rh", "team-b", gpus=2), ("h1", range(2)), flavor=H100),
    ]
    job = make_job("j", gpus=8, flavors=[A100, H100])
    nodes = [make_node("a1", 8, A100), make_node("h1", 8, H100)]
    result = cycle(
        snapshot(nodes, [job], running, tenants=tenants), replace(BEST_FIT, backfill=False)
    )
    reason = result.reason_for("j")
    assert reason is not None and reason.message == "needs 8 free H100-80GB; 6 free in total"
