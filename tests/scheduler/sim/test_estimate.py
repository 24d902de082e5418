"""Wait-time estimates from the present state."""

from __future__ import annotations

from scheduler.sim import estimate_starts
from tests.scheduler.core.builders import BEST_FIT, make_job, make_node, make_running, snapshot


def test_estimates_follow_runtime_bounds():
    # r holds all 8 GPUs from 0 with max runtime 600: a (4 GPUs, 300 s) starts at 600;
    # b (8 GPUs) must wait for a too: 600 + 300 = 900. "huge" fits on no node: None.
    running = [make_running(make_job("r", gpus=8, runtime=600), ("n1", range(8)))]
    pending = [
        make_job("a", gpus=4, runtime=300, submitted_at=50),
        make_job("b", gpus=8, runtime=100, submitted_at=60),
        make_job("huge", gpus=16, runtime=100, submitted_at=70),
    ]
    snap = snapshot([make_node("n1")], pending, running, now=100.0)
    assert estimate_starts(snap, BEST_FIT, horizon_s=3600) == {"a": 600.0, "b": 900.0, "huge": None}


def test_unknown_runtimes_use_the_default():
    # r has no runtime bound: with the default 1000 s it ends at 0 + 1000
    running = [make_running(make_job("r", gpus=8), ("n1", range(8)))]
    snap = snapshot([make_node("n1")], [make_job("a", gpus=8, runtime=10)], running, now=100.0)
    assert estimate_starts(snap, BEST_FIT, default_runtime_s=1000.0) == {"a": 1000.0}


def test_the_estimates_skip_the_reports_statistics(monkeypatch):
    """The estimates read each job's first start alone: the replay's report (percentiles
    of waits by tenant and class, fairness, fragmentation) is not worked out for them."""
    from scheduler.sim.engine import Simulation

    def no_report(self):
        raise AssertionError("the report was worked out")

    monkeypatch.setattr(Simulation, "_report", no_report)
    running = [make_running(make_job("r", gpus=8, runtime=600), ("n1", range(8)))]
    snap = snapshot([make_node("n1")], [make_job("a", gpus=4, runtime=300)], running, now=100.0)
    assert estimate_starts(snap, BEST_FIT, horizon_s=3600) == {"a": 600.0}
