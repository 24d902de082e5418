"""bench/k8s_peers.py at a tiny scale on its own real control plane: kube-scheduler and the
Gantry daemon each bind every pod, and the JSON has the issue's shape. No timing is asserted
(the benchmark is not a test)."""

from __future__ import annotations

from typing import Any

import pytest

from bench.k8s_peers import run_here
from tenants.models import PriorityClass

pytestmark = pytest.mark.kubernetes

PEER_KEYS = {"pods_per_s", "p50_s", "p99_s", "bound", "wall_s", "created_s"}


def test_both_peers_bind_every_pod_and_the_json_has_the_issues_shape(
    transactional_db: Any, tmp_path: Any
) -> None:
    # The daemon commits and listens on its own connection: a transactional database. Another
    # transactional test's flush may have taken the migration's seeded classes with it.
    PriorityClass.objects.get_or_create(
        name="normal",
        defaults={"value": 500, "may_preempt": True, "preemptible": True},
    )
    out = run_here(nodes=4, pods=8, folder=tmp_path / "cp", log=lambda _line: None)
    assert set(out) == {"throughput", "kueue_scenario", "heartbeat", "nodes", "pods", "versions"}
    # The node lifecycle controller ran (the default), and no node fell silent.
    assert out["heartbeat"]["node_lifecycle"] is True
    assert out["heartbeat"]["rounds"] >= 1 and out["heartbeat"]["not_ready_at_end"] == 0
    assert (out["nodes"], out["pods"]) == (4, 8)
    assert set(out["throughput"]) == {"gantry", "kube_scheduler", "kube_scheduler_arrival_paced"}
    for peer, figures in out["throughput"].items():
        assert set(figures) == PEER_KEYS, peer
        assert figures["bound"] == 8, peer
        assert figures["pods_per_s"] > 0 and 0 <= figures["p50_s"] <= figures["p99_s"], peer
    assert out["kueue_scenario"] == {"skipped": "not asked for (--kueue-fraction 0)"}
    assert set(out["versions"]) == {"kubernetes", "etcd", "kueue", "gantry"}
