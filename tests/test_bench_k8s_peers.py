"""bench/k8s_peers.py at a tiny scale on its own real control plane: kube-scheduler and the
Gantry daemon each bind every pod, and the JSON has the issue's shape. No timing is asserted
(the benchmark is not a test)."""

from __future__ import annotations

from typing import Any

import pytest

from bench.k8s_peers import cpu_used, figures, run_here
from tenants.models import PriorityClass

PEER_KEYS = {
    "pods_per_s",
    "p50_s",
    "p99_s",
    "p50_from_start_s",
    "p99_from_start_s",
    "bound",
    "wall_s",
    "started_s",
    "first_bound_s",
    "created_s",
    "pods_per_s_from_creation",
    "cpu_s",
}


@pytest.mark.kubernetes
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
    for peer, measured in out["throughput"].items():
        assert set(measured) == PEER_KEYS, peer
        assert measured["bound"] == 8, peer
        assert measured["pods_per_s"] > 0 and 0 <= measured["p50_s"] <= measured["p99_s"], peer
        # Where the cores went meanwhile: the plane's processes were read, and this one's.
        assert {"kube-apiserver", "etcd", "benchmark", "idle"} <= set(measured["cpu_s"]), peer
    assert out["kueue_scenario"] == {"skipped": "not asked for (--kueue-fraction 0)"}
    assert set(out["versions"]) == {"kubernetes", "etcd", "kueue", "gantry"}


def test_created_first_the_rate_and_the_wait_count_from_the_schedulers_start() -> None:
    # Four pods created over 20 s while their scheduler was stopped, then started at 20 s,
    # binding one a second from 21 s: 4 pods in 4 s, not in 24 (the client's creations are no
    # scheduler's doing); the wait from the start is 1..4 s, from creation 8..24 s.
    created = {i: 100.0 + 20 * i / 3 for i in range(4)}
    bound = {i: 121.0 + i for i in range(4)}
    out = figures(created, bound, started=120.0)
    assert (out["pods_per_s"], out["wall_s"], out["started_s"]) == (1.0, 4.0, 20.0)
    assert out["pods_per_s_from_creation"] == round(4 / 24, 1)
    assert out["first_bound_s"] == 1.0 and out["created_s"] == 20.0
    assert out["p50_from_start_s"] <= out["p99_from_start_s"] <= 4.0
    assert out["p99_s"] > 20.0


def test_arrival_paced_the_rate_counts_from_the_first_creation() -> None:
    created = {i: 100.0 + i for i in range(4)}
    bound = {i: 100.5 + i for i in range(4)}
    out = figures(created, bound)
    assert (out["wall_s"], out["started_s"]) == (3.5, 0.0)
    assert out["pods_per_s"] == out["pods_per_s_from_creation"] == round(4 / 3.5, 1)
    assert out["p50_s"] == out["p50_from_start_s"] == 0.5


def test_the_cpu_used_is_each_kinds_seconds_between_two_readings_busiest_first() -> None:
    before = {"kube-apiserver": 10.0, "benchmark": 5.0, "other": 9.0, "idle": 100.0}
    after = {
        "kube-apiserver": 40.04,
        "benchmark": 7.0,
        "other": 3.0,
        "postgres": 1.0,
        "idle": 112.5,
    }
    out = cpu_used(before, after)
    # A process that exited between the readings took its seconds away: "other" is 0, not -6;
    # one that began between them counts from nothing.
    assert out == {
        "kube-apiserver": 30.0,
        "idle": 12.5,
        "benchmark": 2.0,
        "postgres": 1.0,
        "other": 0.0,
    }
    assert list(out) == ["kube-apiserver", "idle", "benchmark", "postgres", "other"]
