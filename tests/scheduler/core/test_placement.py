"""Filters, scoring plugins and gang placement."""

from __future__ import annotations

from dataclasses import replace

import pytest

from scheduler.core.types import Quota, Taint, Toleration, WaitCode
from tests.scheduler.core.builders import (
    cycle,
    make_job,
    make_node,
    make_running,
    make_tenants,
    placed_nodes,
    snapshot,
)

NOSCHED = Taint("gpu", "reserved")

# (id, nodes, job, node it must land on, or None with the wait code)
FILTERS = [
    (
        "flavor-any-of",
        [make_node("a", model="A100"), make_node("h", model="H100")],
        make_job("j", flavors=["H100", "L40"]),
        "h",
    ),
    (
        "pool",
        [make_node("p1", pool="batch"), make_node("p2", pool="research")],
        make_job("j", pools=["research"]),
        "p2",
    ),
    ("cordoned-skipped", [make_node("c", cordoned=True), make_node("ok")], make_job("j"), "ok"),
    ("unhealthy-skipped", [make_node("bad", healthy=False), make_node("ok")], make_job("j"), "ok"),
    (
        "taint-not-tolerated",
        [make_node("t", taints=[NOSCHED]), make_node("ok")],
        make_job("j"),
        "ok",
    ),
    (
        "taint-tolerated",
        [make_node("t", taints=[NOSCHED])],
        make_job("j", tolerations=[Toleration("gpu")]),
        "t",
    ),
    # 8 GPUs per node: 9 whole GPUs in one replica fit nowhere
    ("whole-gpus-one-node", [make_node("n1"), make_node("n2")], make_job("j", gpus=9), None),
    # the node with 4 GPUs is too small for 6; the 8-GPU node fits
    (
        "enough-devices",
        [make_node("small", gpus=4), make_node("big")],
        make_job("j", gpus=6),
        "big",
    ),
    ("cpu", [make_node("lowcpu", cpu=2000), make_node("ok")], make_job("j", cpu=4000), "ok"),
    (
        "memory",
        [make_node("lowmem", memory=1024), make_node("ok")],
        make_job("j", memory=4096),
        "ok",
    ),
    ("rdma", [make_node("nordma"), make_node("ib", rdma=4)], make_job("j", rdma=2), "ib"),
    (
        "share-needs-gpu-memory",
        [make_node("small", gpu_memory_mib=16384), make_node("big")],
        make_job("j", gpus=0.5, gpu_memory_mib=40000),
        "big",
    ),
]


@pytest.mark.parametrize(
    ("nodes", "job", "expected"), [c[1:] for c in FILTERS], ids=[c[0] for c in FILTERS]
)
def test_filters(nodes, job, expected):
    result = cycle(snapshot(nodes, [job]))
    if expected is None:
        assert result.placement_for(job.id) is None
    else:
        assert placed_nodes(result, job.id) == [expected]


def test_best_fit_packs_the_fuller_node():
    # n1 has 2 free (6 used), n2 8 free: a 2-GPU job fills n1 and leaves n2 whole
    running = [make_running(make_job("r", gpus=6), ("n1", range(6)))]
    result = cycle(snapshot([make_node("n2"), make_node("n1")], [make_job("j", gpus=2)], running))
    assert placed_nodes(result, "j") == ["n1"]


def test_shares_pack_onto_one_device():
    # two half-GPU jobs share device 0 of n1 rather than taking two devices
    jobs = [
        make_job("a", gpus=0.5, gpu_memory_mib=20000),
        make_job("b", gpus=0.5, gpu_memory_mib=20000),
    ]
    result = cycle(snapshot([make_node("n1")], jobs))
    shares = [result.placement_for(j).assignments[0].shares[0] for j in ("a", "b")]
    assert [s.device for s in shares] == [0, 0]
    assert [s.milli for s in shares] == [500, 500]


def test_share_waits_when_no_device_has_enough_gpu_memory():
    # each device: 81920 MiB; a 0.3 share holding 70000 MiB leaves 11920 MiB on every device
    running = [
        make_running(make_job("r", gpus=0.3, gpu_memory_mib=70000), ("n1", [d])) for d in range(2)
    ]
    running = [
        make_running(make_job(f"r{d}", gpus=0.3, gpu_memory_mib=70000), ("n1", [d]))
        for d in range(2)
    ]
    result = cycle(
        snapshot(
            [make_node("n1", gpus=2)], [make_job("j", gpus=0.2, gpu_memory_mib=20000)], running
        )
    )
    reason = result.reason_for("j")
    assert reason is not None and reason.code == WaitCode.GPU_MEMORY
    assert "20000 MiB" in reason.message and "the most is 11920 MiB" in reason.message


def test_gang_is_all_or_nothing():
    # 3 replicas of 8 GPUs on two empty nodes: the third fits nowhere, so none is placed
    result = cycle(
        snapshot([make_node("n1"), make_node("n2")], [make_job("g", gpus=8, replicas=3)])
    )
    assert result.placement_for("g") is None
    # and the capacity the gang tried stays free for the next job
    result = cycle(
        snapshot(
            [make_node("n1"), make_node("n2")],
            [make_job("g", gpus=8, replicas=3), make_job("k", gpus=8, submitted_at=5)],
        )
    )
    assert result.placement_for("k") is not None


@pytest.mark.parametrize(
    ("nodes", "expected"),
    [
        # replicas of 4 GPUs: both fit on one node (8 GPUs) -> same node
        pytest.param([make_node("x"), make_node("y")], ["x", "x"], id="same-node"),
        # 6-GPU replicas cannot share a node; the second follows the first's NVLink domain
        pytest.param(
            [
                make_node("a1", domain="d1"),
                make_node("b1", domain="d2"),
                make_node("a2", domain="d1"),
            ],
            ["a1", "a2"],
            id="same-nvlink-domain",
        ),
        # no domain in common, but a rack
        pytest.param(
            [make_node("r1", rack="r1"), make_node("r2", rack="r2"), make_node("r1b", rack="r1")],
            ["r1", "r1b"],
            id="same-rack",
        ),
    ],
)
def test_topology_keeps_a_gang_close(nodes, expected):
    gpus = 4 if expected[0] == expected[1] else 6
    result = cycle(snapshot(nodes, [make_job("g", gpus=gpus, replicas=2)]))
    assert placed_nodes(result, "g") == expected


def test_fragmentation_reason_counts_free_gpus():
    # n1..n3 each run 5 of 8: 3 free per node, 9 free in total, no node has 4 together
    nodes = [make_node(f"n{i}", model="A100") for i in range(1, 4)]
    running = [
        make_running(make_job(f"r{i}", gpus=5), (f"n{i}", range(5)), flavor="A100")
        for i in range(1, 4)
    ]
    tenants = make_tenants(("team-a", 64, None), flavor="A100")
    result = cycle(snapshot(nodes, [make_job("j", gpus=4)], running, tenants=tenants))
    reason = result.reason_for("j")
    assert reason is not None and reason.code == WaitCode.FRAGMENTATION
    # running jobs have no runtime bound: the profile assumes 86400 s, (86400 - 1000) / 60 = 1423
    assert reason.message == (
        "no node has 4 free A100 together; 9 free in total; devices reserved, expected in 1423 min"
    )


def test_no_matching_node_reason():
    result = cycle(snapshot([make_node("n1", taints=[NOSCHED])], [make_job("j")]))
    assert result.reason_for("j").code == WaitCode.NO_MATCHING_NODE


def test_any_of_flavors_takes_the_best_node_across_them():
    # the A100 node is busier (6 of 8 used): best fit puts a 2-GPU job there, not on the
    # empty H100 node listed first
    nodes = [make_node("h", model="H100"), make_node("a", model="A100")]
    running = [make_running(make_job("r", gpus=6), ("a", range(6)), flavor="A100")]
    tenants = make_tenants(("team-a", 16, None))
    both = (*tenants[:1], replace(tenants[1], quotas={"H100": Quota(8000), "A100": Quota(8000)}))
    result = cycle(
        snapshot(nodes, [make_job("j", gpus=2, flavors=["H100", "A100"])], running, tenants=both)
    )
    assert placed_nodes(result, "j") == ["a"]
    assert result.placement_for("j").flavor == "A100"


def test_unknown_flavor_reason():
    result = cycle(snapshot([make_node("n1")], [make_job("j", flavors=["TPU-v5"])]))
    reason = result.reason_for("j")
    assert reason.code == WaitCode.NO_MATCHING_NODE and reason.message == "no node has TPU-v5"
