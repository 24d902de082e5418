"""Which victims a preemption takes: only what is needed, the least harm, and worth a few
seconds' wait for a cheaper one (issue 35); over random clusters, by hypothesis."""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import replace

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from scheduler.core import run_cycle
from scheduler.core.types import JobKind, RunningJob, Snapshot
from tests.scheduler.core.builders import (
    BEST_FIT,
    make_job,
    make_node,
    make_running,
    make_tenants,
    snapshot,
    victims,
)

PROFILE = replace(BEST_FIT, min_runtime_s=300.0, ping_pong_guard_s=900.0, wait_for_cheaper_s=30.0)
L40S = "L40S"


def scenario(now: float, *, big_checkpoint: float | None = None) -> Snapshot:
    """Issue 35, scenario 2: search (L40S guaranteed 8, limit 16) runs an 8-GPU job from 0
    and a 6-GPU job from 4 (borrowing 6); assist asks for 8 within its guarantee."""
    tenants = make_tenants(("search", 8, 16), ("assist", 8, 16), flavor=L40S)
    big = make_running(
        make_job("big", "search", gpus=8, checkpointable=big_checkpoint is not None),
        ("n1", range(8)),
        flavor=L40S,
        last_checkpoint_at=big_checkpoint,
    )
    small = make_running(
        make_job("small", "search", gpus=6), ("n2", range(6)), flavor=L40S, started_at=4.0
    )
    nodes = [make_node("n1", model=L40S), make_node("n2", model=L40S)]
    pending = [make_job("assist-8", "assist", gpus=8, submitted_at=250.0)]
    return snapshot(nodes, pending, [big, small], tenants=tenants, now=now)


def test_the_borrowing_job_gives_way_not_the_one_within_the_guarantee():
    # At 304 both may give way: the 6-GPU job is what search borrows, the 8-GPU one is
    # within its guarantee. Search stays at its guarantee (8 of 8), assist gets n2.
    result = run_cycle(scenario(304.0), PROFILE)
    assert victims(result) == {"small"}
    assert [a.node for a in result.placement_for("assist-8").assignments] == ["n2"]


def test_the_guarantee_comes_before_work_lost():
    # The 8-GPU job checkpointed at 290 loses less (8 x 14 GPU-s against 6 x 300), but
    # taking it would put search below its guarantee while the borrowing job is enough.
    result = run_cycle(scenario(304.0, big_checkpoint=290.0), PROFILE)
    assert victims(result) == {"small"}


def test_waits_seconds_for_the_cheaper_victim_instead_of_taking_the_costlier_now():
    # At 300 only the 8-GPU job is past the minimum runtime; the 6-GPU one is 4 s from it.
    result = run_cycle(scenario(300.0), PROFILE)
    assert victims(result) == set()
    reason = result.reason_for("assist-8")
    assert reason is not None and "preemption planned in 4 s" in reason.message


def test_without_the_wait_the_eligible_victim_goes_now():
    # wait_for_cheaper_s 0 (or a cheaper victim further away than it): today's choice.
    assert victims(run_cycle(scenario(300.0), replace(PROFILE, wait_for_cheaper_s=0.0))) == {"big"}
    assert victims(run_cycle(scenario(300.0), replace(PROFILE, wait_for_cheaper_s=3.0))) == {"big"}


def test_no_wait_when_the_eligible_victim_is_as_cheap():
    # The soon-eligible job would cost more (it is larger and within the guarantee): take now.
    tenants = make_tenants(("search", 8, 16), ("assist", 8, 16), flavor=L40S)
    old = make_running(make_job("old", "search", gpus=8), ("n2", range(8)), flavor=L40S)
    young = make_running(
        make_job("young", "search", gpus=8), ("n1", range(8)), flavor=L40S, started_at=290.0
    )
    nodes = [make_node("n1", model=L40S), make_node("n2", model=L40S)]
    snap = snapshot(nodes, [make_job("a", "assist", gpus=8)], [old, young], tenants=tenants)
    assert victims(run_cycle(replace(snap, now=310.0), PROFILE)) == {"old"}


# -- inference and training within a team (issue 35, scenario 3) --------------------------


def team_node_full_of_training(priority: str = "high") -> Snapshot:
    training = make_running(make_job("train-6", "team-a", gpus=6), ("n1", range(6)))
    other = make_running(make_job("eval-2", "team-a", gpus=2, priority="low"), ("n1", [6, 7]))
    inference = make_job(
        "infer", "team-a", gpus=0.5, priority=priority, kind=JobKind.INFERENCE, gpu_memory_mib=20000
    )
    return snapshot([make_node("n1")], [inference], [training, other], now=1000.0)


def test_a_fractional_inference_job_does_not_evict_its_teams_large_training_job():
    # 0.5 GPU at high against 6 GPUs at normal: beyond 4 x its request; the 2-GPU low job
    # (within 4 x 0.5) gives way instead.
    result = run_cycle(team_node_full_of_training(), PROFILE)
    assert victims(result) == {"eval-2"}


def test_nothing_small_enough_to_take_the_inference_job_waits():
    snap = team_node_full_of_training()
    snap = replace(snap, running=snap.running[:1])  # only the 6-GPU job, 2 GPUs free
    full = replace(
        snap,
        running=(
            snap.running[0],
            make_running(make_job("pinned-2", "team-a", gpus=2, priority="pinned"), ("n1", [6, 7])),
        ),
    )
    result = run_cycle(full, PROFILE)
    assert victims(result) == set()
    assert result.placement_for("infer") is None


def test_an_admin_lifts_the_bound_or_uses_a_critical_class():
    snap = team_node_full_of_training()
    full = replace(
        snap,
        running=(
            snap.running[0],
            make_running(make_job("pinned-2", "team-a", gpus=2, priority="pinned"), ("n1", [6, 7])),
        ),
    )
    lifted = replace(PROFILE, within_tenant_gpu_ratio=0.0)
    assert victims(run_cycle(full, lifted)) == {"train-6"}
    critical = replace(full, pending=(replace(full.pending[0], priority_class="critical"),))
    assert victims(run_cycle(critical, PROFILE)) == {"train-6"}


# -- properties over random clusters -----------------------------------------------------

TEAMS = ("t1", "t2", "t3")


@st.composite
def preemption_worlds(draw: st.DrawFn) -> Snapshot:
    """Two or three full-ish nodes of one flavor, jobs of three teams placed on them
    (guarantees summing to the capacity), and one pending job."""
    n_nodes = draw(st.integers(2, 3))
    nodes = [make_node(f"n{i}", 8, L40S) for i in range(n_nodes)]
    guarantees = draw(st.sampled_from([(8, 8, 8), (12, 8, 4), (16, 4, 4), (4, 4, 16)]))
    scaled = [g * n_nodes * 8 // sum(guarantees) for g in guarantees]
    scaled[0] += n_nodes * 8 - sum(scaled)  # the cohort's guarantees: exactly the capacity
    tenants = make_tenants(*((t, g, None) for t, g in zip(TEAMS, scaled, strict=True)), flavor=L40S)
    running: list[RunningJob] = []
    for n in range(n_nodes):
        free = 8
        while free > 0 and len(running) < 8:
            gpus = draw(st.integers(1, min(free, 5)))
            ckpt = draw(st.sampled_from([None, 500.0, 900.0]))
            job = make_job(
                f"r{len(running)}",
                draw(st.sampled_from(TEAMS)),
                gpus,
                priority=draw(st.sampled_from(["low", "normal", "high"])),
                checkpointable=ckpt is not None,
            )
            devs = range(8 - free, 8 - free + gpus)
            started = draw(st.sampled_from([0.0, 0.0, 300.0, 650.0, 690.0, 990.0]))
            running.append(
                make_running(
                    job, (f"n{n}", devs), flavor=L40S, started_at=started, last_checkpoint_at=ckpt
                )
            )
            free -= gpus
            if draw(st.integers(0, 5)) == 0:  # a node with room left
                break
    pending = make_job(
        "p",
        draw(st.sampled_from(TEAMS)),
        draw(st.integers(2, 8)),
        priority=draw(st.sampled_from(["normal", "high", "high", "critical"])),
    )
    return snapshot(nodes, [pending], running, tenants=tenants, now=1000.0)


def _placed_without_victims(snap: Snapshot, gone: set[str]) -> bool:
    """Whether the pending job starts with ``gone`` stopped and no one else preempted."""
    left = replace(snap, running=tuple(r for r in snap.running if r.job.id not in gone))
    result = run_cycle(left, replace(PROFILE, wait_for_cheaper_s=0.0))
    placement = result.placement_for("p")
    return placement is not None and not placement.victims


def _usage(snap: Snapshot, tenant: str, gone: Collection[str] = ()) -> int:
    return sum(r.gpu_milli for r in snap.running if r.job.tenant == tenant and r.job.id not in gone)


def _guarantee(snap: Snapshot, tenant: str) -> int:
    return next(t for t in snap.tenants if t.name == tenant).quotas[L40S].guaranteed


def _breach(snap: Snapshot, gone: set[str]) -> int:
    """Milli-GPU other teams fall below their guarantees when ``gone`` stop."""
    owner = snap.pending[0].tenant
    out = 0
    for t in {r.job.tenant for r in snap.running if r.job.id in gone} - {owner}:
        before = max(0, _guarantee(snap, t) - _usage(snap, t))
        out += max(0, _guarantee(snap, t) - _usage(snap, t, gone)) - before
    return out


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(world=preemption_worlds())
def test_victims_are_sufficient_minimal_and_spare_guarantees(world):
    result = run_cycle(world, PROFILE)
    assert run_cycle(world, PROFILE) == result  # deterministic
    chosen = victims(result)
    if not chosen:
        return
    job = world.pending[0]
    assert result.placement_for("p") is not None
    # sufficient: with them gone the job starts; minimal: without any one of them it does not
    assert _placed_without_victims(world, chosen)
    for v in chosen:
        assert not _placed_without_victims(world, chosen - {v}), f"{v} was not needed"
    # a borrowing preemptor never takes from another team (it only reclaims its guarantee)
    owner_after = _usage(world, job.tenant) + job.resources.gpu_milli
    foreign = {p.job_id for p in result.preemptions} & {
        r.job.id for r in world.running if r.job.tenant != job.tenant
    }
    if owner_after > _guarantee(world, job.tenant):
        assert not foreign
    # no team is put further below its guarantee than by one borrower's job that would do
    breach = _breach(world, chosen)
    for r in world.running if breach else ():
        alone = {r.job.id}
        if (
            r.job.tenant != job.tenant
            and r.started_at + 300.0 <= world.now
            and _borrowers_only(world, alone)
            and _breach(world, alone) < breach
        ):
            assert not _placed_without_victims(world, alone), (chosen, alone)


def _borrowers_only(snap: Snapshot, gone: set[str]) -> bool:
    """Whether every team of ``gone`` borrows (reclaim may take only from borrowers)."""
    teams = {r.job.tenant for r in snap.running if r.job.id in gone}
    return all(_usage(snap, t) > _guarantee(snap, t) for t in teams)


# -- no livelock (issue 35, scenario 1) ----------------------------------------------------


def after_the_notebook_reclaimed(now: float) -> Snapshot:
    """After an A100 node failed, nlp's requeued 1-GPU notebook reclaimed from vision (it
    displaced vision-1) and is binding on a2; nlp also runs 8 GPUs on a1, so by the ledger
    (which still counts the failed node's capacity in the guarantees) nlp now borrows 1 and
    vision's other requeued 8-GPU job, within its guarantee, may reclaim."""
    tenants = make_tenants(("nlp", 8, 16), ("vision", 8, 16), flavor="A100")
    nlp_big = make_running(make_job("nlp-big", "nlp", gpus=8), ("a1", range(8)), flavor="A100")
    notebook = make_running(
        make_job("notebook", "nlp", gpus=1, kind=JobKind.INTERACTIVE),
        ("a2", [0]),
        flavor="A100",
        started_at=now - 10.0,
        displaced=["vision-1"],
    )
    notebook = replace(notebook, started=False)  # placed, its pod not started yet
    pending = [  # vision-1, just requeued, backs off a while
        make_job("vision-1", "vision", gpus=8, attempt=1, not_before=now + 60.0),
        make_job("vision-2", "vision", gpus=8, attempt=1),
    ]
    nodes = [make_node("a1", model="A100"), make_node("a2", model="A100")]
    return snapshot(nodes, pending, [nlp_big, notebook], tenants=tenants, now=now)


def test_a_job_that_reclaimed_is_not_reclaimed_back_by_its_victims_tenant_within_the_guard():
    # Before: vision-2 (not the job the notebook displaced) took the notebook back at once
    # (not started: no work lost, the cheapest victim), the notebook then reclaimed from
    # vision again, and so on. Now vision reclaims from nlp's large job or waits.
    result = run_cycle(after_the_notebook_reclaimed(1000.0), PROFILE)
    assert "notebook" not in victims(result)
    later = run_cycle(after_the_notebook_reclaimed(1000.0 + 10.0), PROFILE)
    assert "notebook" not in victims(later)
    # past the guard, the notebook is an ordinary candidate again
    snap = after_the_notebook_reclaimed(1000.0)
    aged = replace(
        snap,
        running=(snap.running[0], replace(snap.running[1], started_at=1000.0 - 901.0)),
    )
    assert victims(run_cycle(aged, PROFILE)) == {"notebook"}
