"""Preemption: who may be a victim, how few and how cheap, and no ping-pong."""

from __future__ import annotations

from dataclasses import replace

import pytest

from scheduler.core.types import JobKind
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

NOW = 1000.0
PROFILE = replace(BEST_FIT, min_runtime_s=300.0, ping_pong_guard_s=900.0)


def full_node(
    job_id: str, tenant: str = "team-a", priority: str = "low", started: float = 0.0, **kw
):
    return make_running(
        make_job(job_id, tenant, gpus=8, priority=priority, **kw),
        ("n1", range(8)),
        started_at=started,
    )


# (id, running on the only node, the new 8-GPU job's tenant and class, victims expected)
CASES = [
    ("lower-priority-same-tenant", full_node("v", priority="low"), ("team-a", "normal"), {"v"}),
    ("equal-priority-never", full_node("v", priority="normal"), ("team-a", "normal"), set()),
    ("higher-priority-never", full_node("v", priority="high"), ("team-a", "normal"), set()),
    ("non-preemptible-never", full_node("v", priority="pinned"), ("team-a", "critical"), set()),
    # started at 800: 1000 - 800 = 200 s < min runtime 300
    ("inside-min-runtime", full_node("v", started=800), ("team-a", "normal"), set()),
    ("critical-overrides-min-runtime", full_node("v", started=800), ("team-a", "critical"), {"v"}),
    # placed at 800 but its pods never started (binding, an image that does not pull): no
    # work to protect, so the minimum runtime does not hold it
    (
        "not-started-binding-job-inside-min-runtime",
        replace(full_node("v", started=800), started=False),
        ("team-a", "normal"),
        {"v"},
    ),
    ("best-effort-of-anyone", full_node("v", "team-b", "best-effort"), ("team-a", "low"), {"v"}),
    # team-b within its guarantee (8 of 64): team-a may not take it, whatever the priority
    ("other-tenant-within-guarantee", full_node("v", "team-b", "low"), ("team-a", "high"), set()),
]


@pytest.mark.parametrize(
    ("running", "job", "expected"), [c[1:] for c in CASES], ids=[c[0] for c in CASES]
)
def test_who_may_be_preempted(running, job, expected):
    tenant, priority = job
    pending = [make_job("new", tenant, gpus=8, priority=priority)]
    result = cycle(snapshot([make_node("n1")], pending, [running], now=NOW), PROFILE)
    assert victims(result) == expected
    assert (result.placement_for("new") is not None) is bool(expected)


def test_fewest_victims_that_lose_least_work():
    # n1 runs a 4-GPU job started at 900 (4 GPU x 100 s = 400 GPU-s lost) and four 1-GPU jobs
    # started at 0 (1000 GPU-s each). A 4-GPU job needs one victim: the cheap 4-GPU one.
    running = [
        make_running(make_job("v4", gpus=4, priority="low"), ("n1", range(4)), started_at=900)
    ]
    running += [
        make_running(make_job(f"v1-{d}", gpus=1, priority="low"), ("n1", [d])) for d in range(4, 8)
    ]
    profile = replace(PROFILE, min_runtime_s=0.0)
    result = cycle(
        snapshot([make_node("n1")], [make_job("new", gpus=4)], running, now=NOW), profile
    )
    assert victims(result) == {"v4"}


def test_checkpoint_makes_a_job_cheaper_to_stop():
    # both ran since 0; "ck" checkpointed at 990: it loses 8 x 10 = 80 GPU-s against 8000
    a = make_running(make_job("plain", gpus=8, priority="low"), ("n1", range(8)))
    b = make_running(
        make_job("ck", gpus=8, priority="low", checkpointable=True),
        ("n2", range(8)),
        last_checkpoint_at=990.0,
    )
    nodes = [make_node("n1"), make_node("n2")]
    result = cycle(snapshot(nodes, [make_job("new", gpus=8)], [a, b], now=NOW), PROFILE)
    assert victims(result) == {"ck"}
    assert result.preemptions[0].work_lost_gpu_s == pytest.approx(80.0)


def test_reclaim_from_a_borrowing_tenant():
    # guarantees 8 each on 16 GPUs; team-b runs 16 (borrows 8). team-a asks for its 8:
    # it stays within its guarantee (0 + 8 <= 8), so it reclaims one of b's jobs, any priority.
    tenants = make_tenants(("team-a", 8, 16), ("team-b", 8, 16))
    running = [
        make_running(make_job(f"b{i}", "team-b", gpus=8, priority="high"), (f"n{i}", range(8)))
        for i in (1, 2)
    ]
    nodes = [make_node("n1"), make_node("n2")]
    result = cycle(
        snapshot(
            nodes,
            [make_job("a", "team-a", gpus=8, priority="low")],
            running,
            tenants=tenants,
            now=NOW,
        ),
        PROFILE,
    )
    assert len(victims(result)) == 1
    assert result.placement_for("a") is not None
    assert "reclaims" in result.preemptions[0].reason


def test_a_borrower_stuck_before_starting_is_reclaimed_inside_its_min_runtime():
    # team-b borrows 8 (16 of its 8) with a job placed 100 s ago (< min runtime 300) whose
    # pods never started (a bad image): team-a reclaims it now, losing no work, instead of
    # waiting for the one that has run since 0.
    tenants = make_tenants(("team-a", 8, 16), ("team-b", 8, 16))
    ran = make_running(make_job("ran", "team-b", gpus=8), ("n1", range(8)), started_at=0.0)
    stuck = make_running(make_job("stuck", "team-b", gpus=8), ("n2", range(8)), started_at=900.0)
    stuck = replace(stuck, started=False)
    pending = [make_job("a", "team-a", gpus=8, priority="low")]
    nodes = [make_node("n1"), make_node("n2")]
    snap = snapshot(nodes, pending, [ran, stuck], tenants=tenants, now=NOW)
    result = cycle(snap, PROFILE)
    assert victims(result) == {"stuck"}
    assert result.preemptions[0].work_lost_gpu_s == 0.0


def test_a_job_that_fits_only_on_a_victims_quota_waits_for_the_victim():
    # team-b (guarantee 8, limit 16) runs a 2 x 8 job, its limit, and waits with a 4-GPU job
    # (16 + 4 > 16). team-a reclaims its guarantee: the 2 x 8 job is preempted. Its 16 stay
    # charged until its pods are gone, so b's 4-GPU job, which fits only on the quota they
    # free, waits for them like the preemptor (else it would run on n3's free GPUs beside
    # the victim: 20 of b's limit of 16). team-c's job, within its own quota, does not.
    tenants = make_tenants(("team-a", 8, 16), ("team-b", 8, 16), ("team-c", 8, 16))
    victim = make_running(
        make_job("b-big", "team-b", gpus=8, replicas=2), ("n1", range(8)), ("n2", range(8))
    )
    pending = [
        make_job("a", "team-a", gpus=8),
        make_job("b-small", "team-b", gpus=4),
        make_job("c", "team-c", gpus=2),
    ]
    nodes = [make_node("n1"), make_node("n2"), make_node("n3", gpus=6)]
    result = cycle(snapshot(nodes, pending, [victim], tenants=tenants, now=NOW), PROFILE)
    assert victims(result) == {"b-big"}
    assert result.placement_for("a").victims == ("b-big",)
    assert result.placement_for("b-small").victims == ("b-big",)
    assert result.placement_for("c").victims == ()


def test_a_running_job_grows_no_replica_on_a_victims_quota():
    # team-b (guarantee 8, limit 12) runs b-big (8 on n1) and an inference job (not
    # preemptible) at 1 of its 3 replicas (4 on n3): 12, its limit, borrowing 4. team-a
    # reclaims 8: b-big is preempted, a waits for it. Growing the inference job by 4 fits b's
    # limit only once b-big is gone (8 + 4 + 4 > 12 while it stops): it grows in a later
    # cycle, not beside the victim.
    tenants = make_tenants(("team-a", 8, 16), ("team-b", 8, 12))
    inference = make_job("b-inf", "team-b", gpus=4, replicas=3, min_replicas=1,
                         priority="pinned", kind=JobKind.INFERENCE)  # fmt: skip
    running = [
        make_running(make_job("b-big", "team-b", gpus=8), ("n1", range(8))),
        make_running(inference, ("n3", range(4))),
    ]
    nodes = [make_node("n1"), make_node("n3", gpus=12)]
    result = cycle(
        snapshot(nodes, [make_job("a", "team-a", gpus=8)], running, tenants=tenants, now=NOW),
        PROFILE,
    )
    assert victims(result) == {"b-big"}
    assert result.placement_for("a").victims == ("b-big",)
    assert result.placement_for("b-inf") is None


def test_no_reclaim_beyond_own_guarantee():
    # team-a already uses its 8; asking 8 more would be borrowing, not reclaiming
    tenants = make_tenants(("team-a", 8, 24), ("team-b", 8, 24))
    running = [make_running(make_job("a0", "team-a", gpus=8), ("n0", range(8)))]
    running += [
        make_running(make_job(f"b{i}", "team-b", gpus=8), (f"n{i}", range(8))) for i in (1, 2)
    ]
    nodes = [make_node(f"n{i}") for i in range(3)]
    result = cycle(
        snapshot(
            nodes,
            [make_job("a1", "team-a", gpus=8, priority="high")],
            running,
            tenants=tenants,
            now=NOW,
        ),
        PROFILE,
    )
    assert victims(result) == set()


def test_no_ping_pong():
    # "winner" preempted "loser" at 950 (50 s ago, guard 900 s). Now team-a borrows (16 of 8)
    # and loser (team-b, within its guarantee) may reclaim from team-a; winner is the cheaper
    # victim (8 x 50 GPU-s against 8 x 1000) but displaced loser: protected until 950 + 900.
    tenants = make_tenants(("team-a", 8, 16), ("team-b", 8, 16))
    winner = make_running(
        make_job("winner", "team-a", gpus=8), ("n1", range(8)), started_at=950, displaced=["loser"]
    )
    other = make_running(make_job("a-other", "team-a", gpus=8), ("n2", range(8)), started_at=0)
    loser = make_job("loser", "team-b", gpus=8, priority="high", attempt=1)
    nodes = [make_node("n1"), make_node("n2")]
    profile = replace(PROFILE, min_runtime_s=0.0)
    result = cycle(snapshot(nodes, [loser], [winner, other], tenants=tenants, now=NOW), profile)
    assert victims(result) == {"a-other"}  # reclaims, but not from the job that displaced it
    later = cycle(
        snapshot(nodes, [loser], [winner, other], tenants=tenants, now=950 + 901), profile
    )
    # guard over: winner is the cheaper victim (8 x 901 GPU-s lost against 8 x 1851)
    assert victims(later) == {"winner"}


def test_elastic_extras_give_way_first():
    # inference job: 2 replicas min, 4 running (2 elastic extras of 2 GPUs) on n1 (8 GPUs).
    # A normal 4-GPU job of the same tenant at lower priority than the inference job's class
    # still takes the extras' room: extras are preemptible by anyone in the tenant.
    inf = make_job("inf", gpus=2, replicas=4, min_replicas=2, priority="high")
    running = make_running(
        inf, ("n1", [0, 1]), ("n1", [2, 3]), ("n1", [4, 5]), ("n1", [6, 7]), elastic_from=2
    )
    result = cycle(
        snapshot([make_node("n1")], [make_job("train", gpus=4)], [running], now=NOW), PROFILE
    )
    assert [p.job_id for p in result.preemptions] == ["inf"]
    preemption = result.preemptions[0]
    assert not preemption.whole_job and sorted(preemption.replicas) == [2, 3]
    assert result.placement_for("train") is not None


def test_quota_only_preemption_takes_the_cheapest_job_anywhere():
    # team-a at its limit 8 with two 4-GPU low jobs (on n1, started 0 and 900); n2 is empty.
    # A normal 4-GPU job fits on n2 but not in quota: the cheaper victim (4 x 100) goes.
    tenants = make_tenants(("team-a", 8, 8), ("team-b", 8, None))
    running = [
        make_running(make_job("old", gpus=4, priority="low"), ("n1", range(4))),
        make_running(
            make_job("young", gpus=4, priority="low"), ("n1", range(4, 8)), started_at=900
        ),
    ]
    nodes = [make_node("n1"), make_node("n2")]
    profile = replace(PROFILE, min_runtime_s=0.0)
    result = cycle(
        snapshot(nodes, [make_job("new", gpus=4)], running, tenants=tenants, now=NOW), profile
    )
    assert victims(result) == {"young"}


def test_gang_preempts_when_only_part_of_it_fits():
    # n1 is empty, n2 runs a low job: one 8-GPU replica fits, the gang of two does not
    running = [make_running(make_job("low", gpus=8, priority="low"), ("n2", range(8)))]
    nodes = [make_node("n1"), make_node("n2")]
    profile = replace(PROFILE, min_runtime_s=0.0)
    result = cycle(
        snapshot(nodes, [make_job("gang", gpus=8, replicas=2)], running, now=NOW), profile
    )
    assert victims(result) == {"low"}
    assert sorted(a.node for a in result.placement_for("gang").assignments) == ["n1", "n2"]


def test_a_search_that_cannot_make_room_takes_no_candidate(monkeypatch):
    # Each node runs one low 1-GPU job (a candidate) and seven normal ones of another class
    # that may not be stopped: stopping every candidate frees one GPU per node, and the new
    # job wants 5 on one node. The search is skipped, not tried candidate by candidate.
    from scheduler.core import preemption

    nodes = [make_node("n1"), make_node("n2")]
    running = []
    for node in ("n1", "n2"):
        running.append(make_running(make_job(f"low-{node}", gpus=1, priority="low"), (node, [0])))
        running += [
            make_running(make_job(f"keep-{node}-{d}", gpus=1, priority="high"), (node, [d]))
            for d in range(1, 8)
        ]
    taken = []
    monkeypatch.setattr(preemption, "_take", lambda *args: taken.append(args) or True)
    profile = replace(PROFILE, min_runtime_s=0.0)
    result = cycle(snapshot(nodes, [make_job("new", gpus=5)], running, now=NOW), profile)
    assert result.placement_for("new") is None
    assert taken == []


def test_precheck_counts_devices_candidates_free():
    # The same cluster, but n1's candidates hold four GPUs beside four free: 4 + 4 >= 5.
    nodes = [make_node("n1")]
    running = [
        make_running(make_job(f"low-{d}", gpus=1, priority="low"), ("n1", [d])) for d in range(4)
    ]
    profile = replace(PROFILE, min_runtime_s=0.0)
    result = cycle(snapshot(nodes, [make_job("new", gpus=5)], running, now=NOW), profile)
    assert result.placement_for("new") is not None
    assert len(victims(result)) == 1


def _two_cohorts(cohort_b_limit: float) -> tuple:
    """org -> cohort-a, cohort-b (guarantee 16 each); each cohort's two teams guarantee 8."""
    from scheduler.core.types import Quota, Tenant

    gpu = 1000

    def quota(guaranteed: float, limit: float) -> dict:
        return {"H100": Quota(round(guaranteed * gpu), round(limit * gpu))}

    return (
        Tenant("org"),
        Tenant("cohort-a", "org", quota(16, 16)),
        Tenant("cohort-b", "org", quota(16, cohort_b_limit)),
        Tenant("a1", "cohort-a", quota(8, 16)),
        Tenant("a2", "cohort-a", quota(8, 16)),
        Tenant("b1", "cohort-b", quota(8, 24)),
        Tenant("b2", "cohort-b", quota(8, 16)),
    )


def _fragmented(extra_b: bool):
    """b1 runs 16 GPUs on n1 and n2 (8 beyond its team's guarantee, borrowed from b2);
    a2 runs 4 on n3 and 4 on n4; `extra_b`: b2 runs 4 more on n4 too... (then cohort-b uses
    beyond its own guarantee). a1 asks for one 8-GPU replica: no node has 8 free."""
    running = [
        make_running(make_job(f"b1-{i}", "b1", gpus=8, priority="high"), (f"n{i}", range(8)))
        for i in (1, 2)
    ]
    running += [
        make_running(make_job("a2-3", "a2", gpus=4, priority="high"), ("n3", range(4))),
        make_running(make_job("a2-4", "a2", gpus=4, priority="high"), ("n4", range(4))),
    ]
    if extra_b:
        running.append(
            make_running(make_job("b2-3", "b2", gpus=4, priority="high"), ("n3", range(4, 8)))
        )
    return running


@pytest.mark.parametrize("cohort_b_borrows", [False, True], ids=["within", "beyond"])
def test_a_reclaim_across_cohorts_only_from_a_cohort_that_borrows(cohort_b_borrows):
    """b1 borrows 8 of its own cohort's guarantees. Cohort-b within its 16: a team of
    cohort-a, within its guarantee, may not reclaim from b1; what a1 lacks is a whole free
    node, not quota b1 took from cohort-a (before: a1 took one of b1's jobs, and b1 took it
    back). Cohort-b at 20 of its 16 (b2's 4 on n3 borrowed from cohort-a): a1 reclaims."""
    result = cycle(
        snapshot(
            [make_node(f"n{i}") for i in (1, 2, 3, 4)],
            [make_job("a1", "a1", gpus=8, priority="low")],
            _fragmented(extra_b=cohort_b_borrows),
            tenants=_two_cohorts(cohort_b_limit=32 if cohort_b_borrows else 16),
            now=NOW,
        ),
        PROFILE,
    )
    assert victims(result) <= {"b1-1", "b1-2", "b2-3"}
    assert bool(victims(result)) is cohort_b_borrows
    assert (result.placement_for("a1") is not None) is cohort_b_borrows


def test_the_branch_toward_a_claimant_is_below_where_the_two_meet():
    from scheduler.core.quota import QuotaLedger

    ledger = QuotaLedger(_two_cohorts(cohort_b_limit=16), ["H100"])
    assert ledger.branch_toward("b1", "a1") == "cohort-b"
    assert ledger.branch_toward("b1", "b2") == "b1"
    assert ledger.branch_toward("b1", "cohort-a") == "cohort-b"
    ledger.charge("b1", "u", "H100", 16_000)  # b1 borrows 8, cohort-b none
    assert ledger.borrowing_from("b1", "b2", "H100") == 8_000
    assert ledger.borrowing_from("b1", "a1", "H100") == 0
    ledger.charge("b2", "u", "H100", 4_000)  # cohort-b now uses 20 of 16
    assert ledger.borrowing_from("b1", "a1", "H100") == 4_000


def test_no_reclaim_of_borrowing_already_on_its_way_back():
    """team-b ran 16 of its 8 GPUs, but one of its two jobs was preempted and its pods are
    stopping (leaving): team-b no longer borrows, and team-a's job waits for that room
    instead of reclaiming team-b's other job too (before: both went)."""
    tenants = make_tenants(("team-a", 8, 16), ("team-b", 8, 16))
    staying = make_running(make_job("b1", "team-b", gpus=8), ("n1", range(8)))
    leaving = replace(
        make_running(make_job("b2", "team-b", gpus=8), ("n2", range(8))), leaving=True
    )
    result = cycle(
        snapshot(
            [make_node("n1"), make_node("n2")],
            [make_job("a", "team-a", gpus=8, priority="low")],
            [staying, leaving],
            tenants=tenants,
            now=NOW,
        ),
        PROFILE,
    )
    assert victims(result) == set()
    assert result.placement_for("a") is None
