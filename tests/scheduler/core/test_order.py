"""Ordering: priority class, then fair share (now and decayed history), then age; aging."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest

from scheduler.core import decay_usage
from scheduler.core.order import effective_priority, fair_share
from tests.scheduler.core.builders import (
    BEST_FIT,
    CLASSES,
    cycle,
    make_job,
    make_node,
    make_running,
    make_tenants,
    snapshot,
)

CLASS_MAP = {c.name: c for c in CLASSES}


def order_of(result, ids):
    """Placement order of the given jobs (a 1-slot cluster admits only the first)."""
    return [p.job_id for p in result.placements if p.job_id in ids]


@pytest.mark.parametrize(
    ("jobs", "first"),
    [
        pytest.param(
            [
                make_job("n", priority="normal", submitted_at=0),
                make_job("h", priority="high", submitted_at=500),
            ],
            "h",
            id="priority-before-age",
        ),
        pytest.param(
            [make_job("late", submitted_at=500), make_job("early", submitted_at=100)],
            "early",
            id="older-first",
        ),
        # team-a already runs 1 GPU on n0: team-b has the lower share and goes first
        pytest.param(
            [make_job("a", "team-a", submitted_at=0), make_job("b", "team-b", submitted_at=10)],
            "b",
            id="fair-share-before-age",
        ),
    ],
)
def test_who_goes_first(jobs, first):
    running = [make_running(make_job("busy", "team-a", gpus=7), ("n0", range(7)))]
    result = cycle(snapshot([make_node("n0")], jobs, running))
    assert [p.job_id for p in result.placements] == [first]


def test_fair_share_interleaves_tenants_within_one_cycle():
    # equal shares: a, b alternate although all of a's jobs are older
    jobs = [make_job(f"a{i}", "team-a", submitted_at=i) for i in range(3)]
    jobs += [make_job(f"b{i}", "team-b", submitted_at=10 + i) for i in range(3)]
    result = cycle(snapshot([make_node("n0")], jobs))
    assert [p.job_id for p in result.placements] == ["a0", "b0", "a1", "b1", "a2", "b2"]


def test_decayed_history_counts_against_a_tenant():
    # team-a used a lot recently: with equal current usage, team-b goes first
    jobs = [make_job("a", "team-a", submitted_at=0), make_job("b", "team-b", submitted_at=10)]
    snap = snapshot([make_node("n0", gpus=1)], jobs, decayed={"team-a": 1e12})
    assert [p.job_id for p in cycle(snap).placements] == ["b"]


def test_aging_lifts_a_long_waiting_job():
    # low = 100, normal = 200; 10 points per hour, capped at 1000:
    # waited 11 h -> 100 + floor(110.0) = 210 > 200
    profile = replace(BEST_FIT, aging_per_hour=10.0, aging_max_boost=1000.0)
    old = make_job("old", priority="low", submitted_at=0)
    new = make_job("new", priority="normal", submitted_at=11 * 3600)
    now = 11 * 3600 + 1
    assert effective_priority(old, CLASS_MAP, now, profile) == pytest.approx(100 + 110, abs=0.01)
    result = cycle(snapshot([make_node("n0", gpus=1)], [new, old], now=now), profile)
    assert [p.job_id for p in result.placements] == ["old"]


def test_aging_is_capped():
    profile = replace(BEST_FIT, aging_per_hour=10.0, aging_max_boost=50.0)
    job = make_job("old", priority="low", submitted_at=0)
    assert effective_priority(job, CLASS_MAP, 1e9, profile) == 150.0  # 100 + cap 50


def test_decay_usage_arithmetic():
    # one half-life later the old value halves; constant use u over it adds u * h/ln2 * 1/2
    h = 3600.0
    out = decay_usage({"a": 1000.0}, {"a": 2000}, h, h)
    assert out["a"] == pytest.approx(500.0 + 2000 * h / math.log(2) * 0.5)
    # exact for splits: two half intervals equal one whole
    split = decay_usage(decay_usage({"a": 1000.0}, {"a": 2000}, h / 2, h), {"a": 2000}, h / 2, h)
    assert split["a"] == pytest.approx(out["a"])


def test_fair_share_formula():
    # current 0.5, history: decayed 1000 * h/ln2 over guarantee 4000 -> 0.25;
    # w = 0.5: (0.5 * 0.5 + 0.5 * 0.25) / weight 2 = 0.1875
    profile = replace(BEST_FIT, history_weight=0.5, half_life_s=100.0)
    decayed = 1000 * 100.0 / math.log(2)
    assert fair_share(0.5, decayed, 4000, 2.0, profile) == pytest.approx(0.1875)


def test_jobs_within_their_guarantee_go_before_borrowers():
    """team-a (guarantee 4) already runs 7 GPUs; one GPU is left. team-b's low-priority job
    fits in its guarantee, team-a's high-priority one would borrow: the guarantee comes
    first (Kueue orders its heads so); without `guaranteed_first`, priority wins."""
    tenants = make_tenants(("team-a", 4, None), ("team-b", 4, None))
    running = [make_running(make_job("busy", "team-a", priority="high", gpus=7), ("n0", range(7)))]
    jobs = [
        make_job("borrower", "team-a", priority="high", submitted_at=0),
        make_job("guaranteed", "team-b", priority="low", submitted_at=10),
    ]
    snap = snapshot([make_node("n0")], jobs, running, tenants=tenants)
    result = cycle(snap)
    assert [p.job_id for p in result.placements] == ["guaranteed"]
    assert not result.preemptions
    # priority first: the borrower takes the free GPU and team-b must reclaim its guarantee
    # by preempting team-a's job (the churn the order avoids)
    result = cycle(snap, replace(BEST_FIT, guaranteed_first=False))
    assert [p.job_id for p in result.placements] == ["borrower", "guaranteed"]
    assert [p.job_id for p in result.preemptions] == ["busy"]
