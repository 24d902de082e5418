"""Arrival-only replay: placements stay, what fits nowhere is skipped."""

from __future__ import annotations

from scheduler.core import Profile
from scheduler.core.types import Resources
from scheduler.sim import replay_placements
from tests.scheduler.core.builders import BEST_FIT, GPU, make_node


def test_replay_places_until_full_and_skips_the_rest():
    # one 8-GPU node: 4 + 2 + 2 fill it, the next 1-GPU request fits nowhere
    wants = [Resources(gpu_milli=g * GPU) for g in (4, 2, 2, 1)]
    got = list(replay_placements([make_node("n1")], [(r, ()) for r in wants], BEST_FIT))
    assert got == [("n1", "H100")] * 3 + [None]


def test_replay_with_online_fragmentation_mix_packs_shares():
    # two nodes, shares of 0.5: FGD with the mix learned online keeps them on one device
    # pair of n1 rather than spreading: 4 halves use 2 devices of n1
    nodes = [make_node("n1", gpus=2), make_node("n2", gpus=2)]
    halves = [(Resources(gpu_milli=500), ())] * 4
    got = list(replay_placements(nodes, halves, Profile()))
    assert got == [("n1", "H100")] * 4
