"""run_cycle as a whole: backoff, invalid jobs, inference elasticity, phases."""

from __future__ import annotations

from scheduler.core import Profile, run_cycle
from scheduler.core.types import JobKind, WaitCode
from tests.scheduler.core.builders import (
    cycle,
    make_job,
    make_node,
    make_running,
    make_tenants,
    snapshot,
)


def test_backoff_keeps_a_retry_waiting():
    job = make_job("retry", not_before=1030.0, attempt=2)
    result = cycle(snapshot([make_node("n1")], [job], now=1000.0))
    reason = result.reason_for("retry")
    assert reason is not None and reason.code == WaitCode.BACKOFF
    assert reason.message == "retry 2 backs off for 30 s more"
    assert cycle(snapshot([make_node("n1")], [job], now=1030.0)).placement_for("retry")


def test_invalid_jobs_wait_with_a_reason_instead_of_breaking_the_cycle():
    bad = [make_job("t", tenant="nobody"), make_job("p", priority="vip"), make_job("g", gpus=1.5)]
    result = cycle(snapshot([make_node("n1")], [*bad, make_job("ok")]))
    assert {w.job_id for w in result.waiting if w.code == WaitCode.INVALID} == {"t", "p", "g"}
    assert result.placement_for("ok") is not None


def test_inference_min_replicas_are_a_gang_and_extras_stay_within_quota():
    # team-a limit 6 GPUs; 2-GPU replicas, min 2, max 5: the gang (4) and one extra (6) fit
    # the limit, the next extra (8) does not.
    tenants = make_tenants(("team-a", 4, 6), ("team-b", 4, None))
    job = make_job("inf", gpus=2, replicas=5, min_replicas=2, kind=JobKind.INFERENCE)
    result = cycle(snapshot([make_node("n1"), make_node("n2")], [job], tenants=tenants))
    placement = result.placement_for("inf")
    assert placement is not None
    assert [a.elastic for a in placement.assignments] == [False, False, True]


def test_running_inference_job_grows_when_quota_frees():
    tenants = make_tenants(("team-a", 8, 8), ("team-b", 8, None))
    job = make_job("inf", gpus=2, replicas=4, min_replicas=1, kind=JobKind.INFERENCE)
    running = make_running(job, ("n1", [0, 1]), elastic_from=1)  # 1 replica of 4
    result = cycle(snapshot([make_node("n1")], [], [running], tenants=tenants))
    placement = result.placement_for("inf")
    assert placement is not None
    assert sorted(a.replica for a in placement.assignments) == [1, 2, 3]  # 2 + 3 x 2 = 8 <= 8


def test_phases_are_announced_in_order():
    seen: list[str] = []
    run_cycle(snapshot([make_node("n1")], [make_job("j")]), Profile(), on_phase=seen.append)
    assert seen == ["snapshot", "order", "schedule", "elastic", "done"]


def test_default_profile_with_fragmentation_scoring_places_everything_that_fits():
    # 4 nodes x 8 = 32 GPUs; 1+2+3+4 four times = 40 requested: 30 of it fits exactly?
    # Each node can take 1+3+4 or 2+... the FGD scorer must still never over-allocate.
    nodes = [make_node(f"n{i}") for i in range(4)]
    jobs = [make_job(f"j{i}", gpus=1 + i % 4, submitted_at=i) for i in range(16)]
    result = run_cycle(snapshot(nodes, jobs), Profile())
    used: dict[tuple[str, int], int] = {}
    for p in result.placements:
        for a in p.assignments:
            for s in a.shares:
                used[(a.node, s.device)] = used.get((a.node, s.device), 0) + s.milli
    assert max(used.values()) <= 1000
    assert sum(used.values()) >= 28_000  # at most one small gap per node after packing


def test_capacity_on_an_admitted_flavor_explains_more_than_quota_on_another():
    # team-a has H100 quota only; the A100 node is idle but not its to use; the H100 node is
    # full. The job waits on H100 capacity, which is what the reason must say.
    nodes = [make_node("a", model="A100"), make_node("h", model="H100")]
    running = [make_running(make_job("r", gpus=8), ("h", range(8)))]
    result = cycle(snapshot(nodes, [make_job("j", gpus=8)], running))
    reason = result.reason_for("j")
    assert reason is not None and reason.code == WaitCode.CAPACITY
    assert reason.message.startswith("needs 8 free H100; 0 free in total")


def test_scoring_plugins_are_made_only_when_a_replica_is_scored(monkeypatch):
    """The fragmentation model and the request mix cost a cycle as much as hundreds of
    waiting jobs: a cycle whose jobs all wait on quota makes no scorers; one that places
    makes them once."""
    import scheduler.core.cycle as engine

    made: list[int] = []
    real = engine._scorers

    def counting(*args):
        made.append(1)
        return real(*args)

    monkeypatch.setattr(engine, "_scorers", counting)
    tenants = make_tenants(("team-a", 4, 4), ("team-b", 4, 4))
    over = [make_job(f"big{i}", gpus=8) for i in range(3)]  # over team-a's limit of 4 GPUs
    result = run_cycle(snapshot([make_node("n1")], over, tenants=tenants), Profile())
    assert {w.code for w in result.waiting} == {WaitCode.QUOTA} and made == []
    fits = [make_job(f"j{i}", gpus=1) for i in range(3)]
    result = run_cycle(snapshot([make_node("n1")], over + fits, tenants=tenants), Profile())
    assert len(result.placements) == 3 and made == [1]


def test_a_larger_request_of_a_team_whose_quota_no_victim_can_fix_skips_the_victim_search(
    monkeypatch,
):
    """team-a is at its limit and has no job it may stop: the first of its jobs searches
    for victims and finds its quota short whatever it stops; the larger ones after it (other
    shapes, so the equal-request memo does not apply) are told their quota reason without a
    search. The smaller one after them searches again (it might fit where they did not)."""
    import scheduler.core.cycle as engine

    searched: list[str] = []
    real = engine.select_victims

    def spying(ctx, job, *args):
        searched.append(job.id)
        return real(ctx, job, *args)

    monkeypatch.setattr(engine, "select_victims", spying)
    tenants = make_tenants(("team-a", 2, 4), ("team-b", 8, None))
    running = [make_running(make_job("r", gpus=4), ("n1", range(4)))]
    pending = [
        make_job("two", gpus=2, submitted_at=1),
        make_job("three", gpus=3, submitted_at=2),
        make_job("pair", gpus=2, replicas=2, submitted_at=3),
        make_job("one", gpus=1, submitted_at=4),
    ]
    result = run_cycle(snapshot([make_node("n1")], pending, running, tenants=tenants), Profile())
    assert searched == ["two", "one"]
    for job_id, needs in (("two", 2), ("three", 3), ("pair", 4), ("one", 1)):
        reason = result.reason_for(job_id)
        assert reason is not None and reason.code == WaitCode.QUOTA, reason
        assert f"job needs {needs}" in reason.message


def test_a_preemption_clears_the_quota_floors():
    """team-a borrows and may stop none of its own jobs: its first job sets a floor. Then
    team-b reclaims its guarantee from team-a, whose usage falls back within its own; team-a's
    next job, larger than the floor, may now reclaim in turn from team-c, which borrows. It
    does: the floor did not outlive the preemption. (Aging orders the three jobs: a, b, a.)"""
    profile = Profile(
        score_weights={"GpuFit": 1.0}, min_runtime_s=0.0, guaranteed_first=False,
        aging_per_hour=1.0,
    )  # fmt: skip
    tenants = make_tenants(("team-a", 2, None), ("team-b", 2, None), ("team-c", 4, None))
    running = [
        make_running(make_job("ra", "team-a", gpus=3), ("n1", range(3))),
        make_running(make_job("rc", "team-c", gpus=5), ("n1", range(3, 8))),
    ]
    now = 10_000.0
    pending = [
        make_job("a1", "team-a", gpus=1, submitted_at=now - 7300),  # aged two points
        make_job("b1", "team-b", gpus=2, submitted_at=now - 3700),  # one point
        make_job("a2", "team-a", gpus=2, submitted_at=now - 10),
    ]
    snap = snapshot([make_node("n1")], pending, running, tenants=tenants, now=now)
    result = run_cycle(snap, profile)
    reason = result.reason_for("a1")
    assert reason is not None and reason.code == WaitCode.QUOTA, reason
    by_preemptor = {p.preemptor: p.job_id for p in result.preemptions}
    assert by_preemptor == {"b1": "ra", "a2": "rc"}, result.preemptions


def test_only_a_quota_short_search_sets_a_floor():
    """team-a's two-GPU job waits on room (no node has two free GPUs together, and stopping
    its low job would not make two): that says nothing of its quota. Its larger job after
    it (three single-GPU replicas) is over its limit, and stopping the low job fixes that;
    the three free GPUs on three nodes hold it. It preempts."""
    tenants = make_tenants(("team-a", 3, 3), ("team-b", 28, None))
    nodes = [make_node(f"n{i}") for i in range(1, 5)]
    running = [
        make_running(make_job(f"b{i}", "team-b", gpus=7), (f"n{i}", range(7))) for i in range(1, 4)
    ]
    running += [
        make_running(make_job("b4", "team-b", gpus=7), ("n4", range(1, 8))),
        make_running(make_job("low", "team-a", gpus=1, priority="low"), ("n4", [0])),
    ]
    pending = [
        make_job("pair", "team-a", gpus=2, submitted_at=1),
        make_job("three", "team-a", gpus=1, replicas=3, submitted_at=2),
    ]
    result = cycle(snapshot(nodes, pending, running, tenants=tenants))
    reason = result.reason_for("pair")
    assert reason is not None and reason.code != WaitCode.QUOTA, reason
    assert [(p.preemptor, p.job_id) for p in result.preemptions] == [("three", "low")]
