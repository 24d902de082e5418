"""A waiting job's reason names the preemption planned for it, and when (issue 35, item 5):
the lender whose borrower is inside its minimum runtime, the job behind a young job of
lower priority, the wait for a cheaper victim."""

from __future__ import annotations

from dataclasses import replace

import pytest

from scheduler.core.types import PreemptionCause, WaitCode
from tests.scheduler.core.builders import (
    BEST_FIT,
    cycle,
    make_job,
    make_node,
    make_running,
    make_tenants,
    snapshot,
    victims,
)
from tests.scheduler.core.test_victims import PROFILE as VICTIMS_PROFILE
from tests.scheduler.core.test_victims import scenario

NOW = 1000.0
# wait_for_cheaper_s 30: a victim further than 30 s from eligible is a plan, not a wait.
PROFILE = replace(BEST_FIT, min_runtime_s=300.0, ping_pong_guard_s=900.0, wait_for_cheaper_s=30.0)


def lender_waits(*starts: float, gpus: int = 8):
    """team-a (guaranteed 8) lent its share: team-b (guaranteed 8) runs 8 GPUs from 990
    and 8 more in jobs of 8 / len(starts) GPUs started at ``starts``, all inside their
    minimum runtime (300 s). The cohort (16) is full: team-a's job within its guarantee
    waits on quota."""
    tenants = make_tenants(("team-a", 8, 16), ("team-b", 8, 16))
    own = make_running(make_job("b-own", "team-b", gpus=8), ("n1", range(8)), started_at=990)
    size = 8 // len(starts)
    borrowed = [
        make_running(
            make_job(f"b{i}", "team-b", gpus=size),
            ("n2", range(i * size, (i + 1) * size)),
            started_at=start,
        )
        for i, start in enumerate(starts)
    ]
    pending = [make_job("a", "team-a", gpus=gpus)]
    nodes = [make_node("n1"), make_node("n2")]
    return snapshot(nodes, pending, [own, *borrowed], tenants=tenants, now=NOW)


def test_a_lender_is_told_the_reclaim_and_when_not_a_bare_quota_line():
    # b0 started at 880: its minimum runtime ends at 880 + 300 = 1180, in 180 s = 3 min
    # (b-own's at 1290).
    result = cycle(lender_waits(880.0), PROFILE)
    assert victims(result) == set()
    reason = result.reason_for("a")
    assert reason is not None and reason.code == WaitCode.QUOTA
    assert reason.message.endswith(
        "; team-a reclaims its guarantee from team-b (8 H100 lent): preemption planned in "
        "about 3 min, when its job leaves its minimum runtime"
    )
    assert reason.plan is not None
    assert (reason.plan.at, reason.plan.cause) == (1180.0, PreemptionCause.RECLAIM)
    assert (reason.plan.victims, reason.plan.tenants, reason.plan.milli) == (
        ("b0",),
        ("team-b",),
        8000,
    )


# (id, start times of team-b's borrowing jobs, GPUs team-a asks, victims, when)
EARLIEST = [
    # two 4-GPU borrowers; 4 GPUs need one: the one eligible first (900 + 300)
    ("one-of-two-is-enough", (950.0, 900.0), 4, ("b1",), 1200.0),
    # 8 GPUs need both: when the younger leaves its minimum runtime (950 + 300)
    ("both-needed", (950.0, 900.0), 8, ("b0", "b1"), 1250.0),
]


@pytest.mark.parametrize(
    ("starts", "gpus", "expected", "at"), [c[1:] for c in EARLIEST], ids=[c[0] for c in EARLIEST]
)
def test_the_plan_is_the_earliest_sufficient_set(starts, gpus, expected, at):
    reason = cycle(lender_waits(*starts, gpus=gpus), PROFILE).reason_for("a")
    assert reason is not None and reason.plan is not None
    assert (tuple(sorted(reason.plan.victims)), reason.plan.at) == (expected, at)


def test_a_job_behind_a_young_job_of_lower_priority_is_told_it_will_preempt_it():
    # team-a's 2-GPU low job started at 740 leaves its minimum runtime at 1040, in 40 s
    # (beyond the 30 s a preemptor waits for a cheaper victim: a plan, not a wait).
    low = make_running(make_job("low", gpus=2, priority="low"), ("n1", range(2)), started_at=740)
    high = make_running(make_job("peer", gpus=6, priority="high"), ("n1", range(2, 8)))
    pending = [make_job("urgent", gpus=2, priority="high")]
    result = cycle(snapshot([make_node("n1")], pending, [low, high], now=NOW), PROFILE)
    reason = result.reason_for("urgent")
    assert reason is not None and reason.plan is not None
    assert (
        "; will preempt 1 job of lower priority (2 H100): preemption planned in 40 s, when it "
        "leaves its minimum runtime" in reason.message
    )
    assert reason.plan.cause == PreemptionCause.PRIORITY and reason.plan.tenants == ()


def test_no_plan_is_told_where_no_victim_may_ever_give_way():
    # The same, but the young job is of a non-preemptible class: nothing is planned.
    pinned = make_running(
        make_job("pinned", gpus=2, priority="pinned"), ("n1", range(2)), started_at=740
    )
    high = make_running(make_job("peer", gpus=6, priority="high"), ("n1", range(2, 8)))
    pending = [make_job("urgent", gpus=2, priority="high")]
    result = cycle(snapshot([make_node("n1")], pending, [pinned, high], now=NOW), PROFILE)
    told = result.reason_for("urgent")
    assert told is not None and told.plan is None and "planned" not in told.message


def test_the_wait_for_a_cheaper_victim_names_it_too():
    # Issue 35's scenario 2 at 300: the 6-GPU borrowing job of search is 4 s from eligible.
    result = cycle(scenario(300.0), VICTIMS_PROFILE)
    reason = result.reason_for("assist-8")
    assert reason is not None and reason.plan is not None
    told = "assist reclaims its guarantee from search (6 L40S lent): preemption planned in 4 s"
    assert told in reason.message
    assert (reason.plan.victims, reason.plan.at) == (("small",), 304.0)


def test_equal_jobs_share_the_plan_with_their_reason():
    snap = lender_waits(880.0)
    twin = replace(snap.pending[0], id="a2")
    result = cycle(replace(snap, pending=(*snap.pending, twin)), PROFILE)
    first, second = result.reason_for("a"), result.reason_for("a2")
    assert first is not None and second is not None and first.plan is not None
    assert second.plan == first.plan and second.message == first.message
