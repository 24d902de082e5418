"""Scoring plugins, one table each, with the arithmetic of every expected score."""

from __future__ import annotations

import numpy as np
import pytest

from scheduler.core.scoring import FragmentationScore, GpuFit, ScoreInput, TopologyScore
from scheduler.core.tentative import ClusterState
from scheduler.core.types import DeviceShare, Resources
from tests.scheduler.core.builders import GPU, make_node


def state_with(used: dict[str, list[int]], nodes=None) -> ClusterState:
    """Nodes n0..n3 (8 GPUs); ``used[node]``: milli taken on each listed device in turn."""
    state = ClusterState(nodes or [make_node(f"n{i}") for i in range(4)])
    for name, millis in used.items():
        shares = tuple(DeviceShare(d, m, 0) for d, m in enumerate(millis))
        state.apply(state.index[name], shares, 0, 0, 0, +1)
    return state


def inp(state, nodes, gpus=1.0, devices=None, placed=(), remaining=1) -> ScoreInput:
    res = Resources(gpu_milli=round(gpus * GPU))
    dev = None if devices is None else np.array(devices)
    return ScoreInput(state, np.array(nodes), dev, res, (), list(placed), remaining)


@pytest.mark.parametrize(
    ("used", "gpus", "expected"),
    [
        # n0 empty: 8000 - 2000 = 6000 left -> 1 - 6000/8000 = 0.25;
        # n1 has 6 devices busy: 2000 - 2000 = 0 left -> 1.0
        pytest.param({"n1": [GPU] * 6}, 2, [0.25, 1.0], id="best-fit-prefers-fuller"),
        # n1 has half a device busy: 7500 - 1000 = 6500 left -> 1 - 6500/8000 = 0.1875
        pytest.param({"n1": [500]}, 1, [0.125, 0.1875], id="counts-partial-devices"),
    ],
)
def test_gpu_fit_whole(used, gpus, expected):
    state = state_with(used)
    assert GpuFit().score(inp(state, [0, 1], gpus)).tolist() == pytest.approx(expected)


def test_gpu_fit_share_scores_the_device():
    # a 0.25 share: device 0 of n1 has 500 free -> 250 left -> 1 - 0.25 = 0.75;
    # device 0 of n0 is whole -> 750 left -> 0.25
    state = state_with({"n1": [500]})
    scores = GpuFit().score(inp(state, [0, 1], 0.25, devices=[0, 0]))
    assert scores.tolist() == pytest.approx([0.25, 0.75])


def test_topology_score_tiers():
    # gang already on n0 (domain d0, rack r0); candidates: n0 itself, n1 (same domain),
    # n2 (same rack only), n3 (nothing shared) -> 1, 2/3, 1/3, 0
    nodes = [
        make_node("n0", domain="d0", rack="r0"),
        make_node("n1", domain="d0", rack="r0"),
        make_node("n2", domain="d1", rack="r0"),
        make_node("n3", domain="d2", rack="r1"),
    ]
    state = state_with({}, nodes)
    scores = TopologyScore().score(inp(state, [0, 1, 2, 3], placed=[0]))
    assert scores.tolist() == pytest.approx([1.0, 2 / 3, 1 / 3, 0.0])


def test_topology_first_replica_prefers_room_for_the_gang():
    # 3 replicas of 4 GPUs = 12 wanted; n0 has 8 whole free -> 8/12, n1 4 free -> 4/12
    state = state_with({"n1": [GPU] * 4})
    scores = TopologyScore().score(inp(state, [0, 1], 4, remaining=3))
    assert scores.tolist() == pytest.approx([8 / 12, 4 / 12])


def test_fragmentation_score_is_minus_the_coarse_fragmentation_added():
    # mix: only 4-GPU jobs. A 2-GPU job on n0 (4 free) leaves 2: no 4-GPU job fits there any
    # more, so both stay stranded: +2000 milli. On n1 (5 free) it leaves 3: +3000 milli.
    # In steps of 500 milli, as GPUs: -2.0 and -3.0.
    state = state_with({"n0": [GPU] * 4, "n1": [GPU] * 3})
    scorer = FragmentationScore(state, [((Resources(gpu_milli=4 * GPU), ()), 10)])
    assert scorer.score(inp(state, [0, 1], 2)).tolist() == pytest.approx([-2.0, -3.0])


def test_fragmentation_score_follows_state_changes():
    # after n0 fills up to 2 free, a 2-GPU job there strands nothing more: 2 free -> 0
    state = state_with({"n0": [GPU] * 4})
    scorer = FragmentationScore(state, [((Resources(gpu_milli=4 * GPU), ()), 10)])
    assert scorer.score(inp(state, [0], 2)).tolist() == pytest.approx([-2.0])
    state.apply(0, tuple(DeviceShare(d, GPU, 0) for d in (4, 5)), 0, 0, 0, +1)
    # before: 2 free, all stranded (2000); after: 0 free, 0 stranded: delta -2000 -> +2.0
    assert scorer.score(inp(state, [0], 2)).tolist() == pytest.approx([2.0])


def test_a_node_is_signed_when_its_signature_is_read_not_at_every_change(monkeypatch):
    # Trial placements and rollbacks change a node many times between two reads: it is
    # signed once, when read, and the signature is that of a node in the same state.
    state = state_with({})
    calls = []
    sign = ClusterState._sign
    monkeypatch.setattr(ClusterState, "_sign", lambda self, i: calls.append(i) or sign(self, i))
    for _ in range(50):
        state.apply(0, (DeviceShare(0, GPU, 0),), 0, 0, 0, +1)
        state.apply(0, (DeviceShare(0, GPU, 0),), 0, 0, 0, -1)
    state.apply(0, (DeviceShare(1, GPU, 0),), 0, 0, 0, +1)
    assert calls == []
    state.apply(1, (DeviceShare(1, GPU, 0),), 0, 0, 0, +1)
    first = state.signatures(np.array([0, 1, 2]))
    assert sorted(calls) == [0, 1]
    assert first[0] == first[1] != first[2]  # n0 and n1 both have device 1 taken
    assert state.signatures(np.array([0, 1])) == first[:2] and sorted(calls) == [0, 1]


def test_the_fragmentation_model_syncs_only_the_nodes_it_scores(monkeypatch):
    state = state_with({})
    scorer = FragmentationScore(state, [((Resources(gpu_milli=4 * GPU), ()), 10)])
    synced = []
    update = scorer.model.update_node
    monkeypatch.setattr(
        scorer.model, "update_node", lambda i, **kw: synced.append(i) or update(i, **kw)
    )
    state.apply(2, tuple(DeviceShare(d, GPU, 0) for d in range(4)), 0, 0, 0, +1)
    state.apply(3, tuple(DeviceShare(d, GPU, 0) for d in range(3)), 0, 0, 0, +1)
    # n0, n1: 8 free, 6 left, where a 4-GPU job still fits: nothing stranded
    assert scorer.score(inp(state, [0, 1], 2)).tolist() == pytest.approx([0.0, 0.0])
    assert synced == []  # n2 and n3 changed, but were not scored
    # n2: 4 free, a 2-GPU job strands the other 2 (+2000); n3: 5 free, leaves 3 (+3000)
    assert scorer.score(inp(state, [2, 3], 2)).tolist() == pytest.approx([-2.0, -3.0])
    assert sorted(synced) == [2, 3]


def test_fragmentation_scores_come_whole_from_the_memo_coarsened_alike(monkeypatch):
    """A node state scored once is looked up, not computed, for the same request: the
    memo holds the score itself, in steps of the scorer's step (1,500 milli here) and in
    GPUs, so a hit gives what the miss gave."""
    state = state_with({"n2": [GPU] * 4, "n3": [GPU] * 3})
    scorer = FragmentationScore(state, [((Resources(gpu_milli=4 * GPU), ()), 10)], 1500)
    # n2: 4 free, a 2-GPU job strands the other 2 (2,000 -> one step of 1,500); n3: 5 free,
    # it leaves 3 stranded (3,000: two steps)
    assert scorer.score(inp(state, [2, 3], 2)).tolist() == pytest.approx([-1.5, -3.0])
    computed = []
    score = scorer.model.score
    monkeypatch.setattr(scorer.model, "score", lambda *a: computed.append(a) or score(*a))
    assert scorer.score(inp(state, [3, 2], 2)).tolist() == pytest.approx([-3.0, -1.5])
    assert computed == []
