"""The simulated cluster's nodes (`scheduler.backends.simulated.inventory`): the openb node list."""

from __future__ import annotations

from pathlib import Path

from scheduler.backends.simulated.inventory import nodes_from_openb_csv

OPENB = Path(__file__).resolve().parents[4] / "shared/bench/openb/openb_node_list_gpu_node.csv"


def test_openb_node_list_loads() -> None:
    nodes = nodes_from_openb_csv(OPENB)
    assert len(nodes) == 1213
    assert {n.flavor for n in nodes} >= {"T4-16GB", "P100-16GB", "V100-32GB"}
