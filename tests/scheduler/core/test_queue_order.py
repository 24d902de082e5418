"""`queue_order`: the queue in the order a cycle considers it, for queue positions."""

from __future__ import annotations

from scheduler.core import queue_order, run_cycle
from tests.scheduler.core.builders import BEST_FIT, make_job, make_node, make_running, snapshot


def _full_cluster_queue():
    # team-a runs 8 GPUs on the only node (8 GPUs): no pending job (16 GPUs each) fits.
    running = [make_running(make_job("r", "team-a", gpus=8), ("n1", range(8)))]
    pending = [
        make_job("a1", "team-a", gpus=16, priority="normal", submitted_at=10),
        make_job("a2", "team-a", gpus=16, priority="high", submitted_at=20),
        make_job("b1", "team-b", gpus=16, priority="normal", submitted_at=5),
        make_job("b2", "team-b", gpus=16, priority="normal", submitted_at=30),
    ]
    return snapshot([make_node("n1")], pending, running)


def test_queue_order_is_priority_then_fair_share_then_age():
    # a2 is high: first. Then the normal heads a1 and b1 compete on fair share: team-a uses
    # 8/64 of its guarantee, team-b 0, so b1, then b2 (team-b's share is still 0: nothing is
    # admitted while ordering), then a1.
    order = [job.id for job in queue_order(_full_cluster_queue(), BEST_FIT)]
    assert order == ["a2", "b1", "b2", "a1"]


def test_queue_order_is_the_order_the_cycle_handles_jobs_in():
    # With nothing placed, the cycle records every job's reason in the order it handled them.
    snap = _full_cluster_queue()
    handled = [w.job_id for w in run_cycle(snap, BEST_FIT).waiting]
    assert handled == [job.id for job in queue_order(snap, BEST_FIT)]


def test_live_jobs_are_not_in_the_queue():
    # A queued job that still holds devices (its pods are stopping) waits for no position.
    snap = _full_cluster_queue()
    snap = snapshot(
        [make_node("n1")],
        [*snap.pending, make_job("r", "team-a", gpus=8)],
        snap.running,
    )
    assert "r" not in [job.id for job in queue_order(snap, BEST_FIT)]
