"""Proof-of-concept scenarios, replayed through the simulator on virtual time."""

from __future__ import annotations

from dataclasses import replace

import pytest

from scheduler.core.types import JobKind
from scheduler.sim import Cluster, NodeOutage, SimConfig, Simulation, WorkloadJob, simulate
from scheduler.sim.measures import time_average
from tests.scheduler.core.builders import (
    BEST_FIT,
    CLASSES,
    make_job,
    make_node,
    make_tenants,
)

TWO_TEAMS = make_tenants(("team-a", 8, None), ("team-b", 8, None))


def cluster(*nodes, tenants=TWO_TEAMS):
    return Cluster(tuple(nodes), tuple(tenants), CLASSES)


def job(job_id, at, duration, **kw):
    return WorkloadJob(make_job(job_id, **kw), at, duration)


def test_training_jobs_queue_and_run_in_turn():
    # 8 GPUs, four 4-GPU jobs of 100 s at t=0: two run at once, the others wait 100 s
    work = [job(f"t{i}", 0.0, 100.0, gpus=4, submitted_at=i) for i in range(4)]
    report = simulate(work, cluster(make_node("n1")), BEST_FIT)
    assert [report.outcome(f"t{i}").wait_s for i in range(4)] == [0.0, 0.0, 100.0, 100.0]
    assert report.makespan_s == 200.0
    assert report.utilization == pytest.approx(1.0)  # 8 GPUs x 200 s of 8 x 200
    assert report.wait_by_class["normal"].p50 == pytest.approx(50.0)


def test_priority_preemption_requeues_the_low_job():
    # low runs 0..; high arrives at 50 and takes the node; low restarts at 150 (no checkpoint)
    work = [
        job("low", 0.0, 100.0, gpus=8, priority="low"),
        job("high", 50.0, 100.0, gpus=8, priority="high"),
    ]
    report = simulate(work, cluster(make_node("n1")), BEST_FIT)
    assert report.preemptions == 1
    assert report.gpu_hours_lost_to_preemption == pytest.approx(8 * 50 / 3600)
    assert report.outcome("high").first_start_s == 50.0
    assert report.outcome("low").end_s == 150.0 + 100.0
    assert report.outcome("low").attempts == 2


def test_checkpointed_job_keeps_its_progress():
    # checkpoints every 20 s: preempted at 50 it keeps 40 s, needs 60 s more after 150
    work = [
        job("low", 0.0, 100.0, gpus=8, priority="low", checkpointable=True),
        job("high", 50.0, 100.0, gpus=8, priority="high"),
    ]
    config = SimConfig(checkpoint_interval_s=20.0)
    report = simulate(work, cluster(make_node("n1")), BEST_FIT, config=config)
    assert report.outcome("low").end_s == 150.0 + 60.0
    assert report.gpu_hours_lost_to_preemption == pytest.approx(8 * 10 / 3600)


def test_quota_limit_holds_a_job_back_while_gpus_sit_idle():
    # team-a limit 8 on 16 GPUs: its second 8-GPU job waits for the first
    tenants = make_tenants(("team-a", 8, 8), ("team-b", 8, None))
    work = [job("a1", 0.0, 100.0, gpus=8), job("a2", 0.0, 100.0, gpus=8, submitted_at=1)]
    report = simulate(work, cluster(make_node("n1"), make_node("n2"), tenants=tenants), BEST_FIT)
    assert report.outcome("a2").wait_s == 100.0
    assert report.utilization == pytest.approx(0.5)  # 8 of 16 GPUs for all 200 s


def test_borrowing_then_reclaim():
    # team-b borrows team-a's idle 8 GPUs; team-a's job arrives at 30 and reclaims them
    work = [
        job("b1", 0.0, 100.0, gpus=8, tenant="team-b"),
        job("b2", 0.0, 100.0, gpus=8, tenant="team-b", submitted_at=1),
        job("a1", 30.0, 100.0, gpus=8, tenant="team-a"),
    ]
    report = simulate(work, cluster(make_node("n1"), make_node("n2")), BEST_FIT)
    assert report.outcome("b2").first_start_s == 0.0  # borrowed while idle
    assert report.outcome("a1").wait_s == 0.0  # reclaimed at once
    assert report.preemptions == 1
    assert sorted(report.outcome(b).attempts for b in ("b1", "b2")) == [1, 2]


def test_packing_avoids_fragmentation():
    # four 2-GPU jobs then an 8-GPU job on two 8-GPU nodes: packed on one node, the big job
    # finds the other whole; with any spreading it would wait 100 s
    work = [job(f"s{i}", 0.0, 100.0, gpus=2, submitted_at=i) for i in range(4)]
    work.append(job("big", 1.0, 100.0, gpus=8))
    for profile in (BEST_FIT, replace(BEST_FIT, score_weights={"FragmentationScore": 1.0})):
        report = simulate(work, cluster(make_node("n1"), make_node("n2")), profile)
        assert report.outcome("big").wait_s == 0.0
        assert report.fragmented_gpu_pct == 0.0


def test_fragmentation_is_reported():
    # three 5-GPU jobs on three nodes, then a 4-GPU job: 9 free GPUs, none 4 together
    nodes = [make_node(f"n{i}") for i in range(3)]
    tenants = make_tenants(("team-a", 24, None))
    work = [job(f"f{i}", 0.0, 100.0, gpus=5, submitted_at=i) for i in range(3)]
    work.append(job("four", 10.0, 10.0, gpus=4))
    report = simulate(work, cluster(*nodes, tenants=tenants), BEST_FIT)
    assert report.outcome("four").wait_s == 90.0
    # 9 of 24 GPUs fragmented from 10 to 100 s of a 110 s makespan: 9/24 x 90/110 = 30.7%
    assert report.fragmented_gpu_pct == pytest.approx(100 * 9 / 24 * 90 / 110)


def test_shared_request_larger_than_any_device_memory_never_runs():
    work = [job("share", 0.0, 10.0, gpus=0.5, gpu_memory_mib=100_000)]
    report = simulate(work, cluster(make_node("n1", gpu_memory_mib=81920)), BEST_FIT)
    outcome = report.outcome("share")
    assert outcome.state == "unfinished"
    assert "nothing in the cluster can hold this job today" in outcome.reason
    assert "100000 MiB of GPU memory; the most is 81920 MiB" in outcome.reason


def test_node_failure_requeues_jobs_elsewhere():
    # n1 fails at 40: its job restarts on n2 at once and finishes 100 s later
    work = [job("j", 0.0, 100.0, gpus=8)]
    nodes = (make_node("n1"), make_node("n2"))
    report = simulate(work, cluster(*nodes), BEST_FIT, outages=[NodeOutage("n1", 40.0, 1000.0)])
    outcome = report.outcome("j")
    assert (outcome.end_s, outcome.attempts, outcome.state) == (140.0, 2, "succeeded")
    assert report.gpu_hours_lost_to_failures == pytest.approx(8 * 40 / 3600)


def test_retry_with_backoff():
    # fails 10 s into each of its first two runs; backoff 10 s then 20 s:
    # run 0..10, wait to 20, run 20..30, wait to 50, run 50..150
    work = [WorkloadJob(make_job("flaky", gpus=1), 0.0, 100.0, failures=2, fail_after_s=10.0)]
    config = SimConfig(retry_base_s=10.0)
    report = simulate(work, cluster(make_node("n1")), BEST_FIT, config=config)
    outcome = report.outcome("flaky")
    assert (outcome.end_s, outcome.attempts, outcome.state) == (150.0, 3, "succeeded")


def test_retries_give_up_after_max_attempts():
    work = [WorkloadJob(make_job("doomed", gpus=1), 0.0, 100.0, failures=9, fail_after_s=5.0)]
    config = SimConfig(retry_base_s=1.0, max_attempts=3)
    report = simulate(work, cluster(make_node("n1")), BEST_FIT, config=config)
    assert report.outcome("doomed").state == "failed"
    assert report.outcome("doomed").attempts == 3


def test_inference_scales_within_quota_and_gives_way():
    # team-a limit 6: inference (2 GPUs per replica, min 1, max 4) runs 3 replicas = 6 GPUs;
    # a training job of team-a at 50 (2 GPUs) takes an extra's place
    tenants = make_tenants(("team-a", 6, 6), ("team-b", 8, None))
    inference = make_job(
        "inf", gpus=2, replicas=4, min_replicas=1, kind=JobKind.INFERENCE, priority="high"
    )
    work = [WorkloadJob(inference, 0.0, 1000.0), job("train", 50.0, 100.0, gpus=2)]
    report = simulate(work, cluster(make_node("n1"), make_node("n2"), tenants=tenants), BEST_FIT)
    assert max(gpus for t, gpus in report.allocation if t < 50) == 6.0  # 3 replicas x 2
    assert report.outcome("train").wait_s == 0.0
    assert report.preemptions == 1
    assert report.outcome("inf").attempts == 1  # the inference job itself kept running


def starving_workload():
    """A large low-priority job behind a stream of small normal ones (each 100 s, one every
    25 s on an 8-GPU node: the node never has 8 GPUs free together while the stream lasts)."""
    work = [job("large", 10.0, 100.0, gpus=8, priority="low", runtime=200.0)]
    work += [job(f"s{i}", 25.0 * i, 100.0, gpus=2, runtime=100.0) for i in range(80)]
    return work  # the stream ends at 25 x 79 + 100 = 2075 s


def test_starving_large_job_starts_with_aging_and_backfill():
    # aging 360 points/h = 1 per 10 s: low (100) passes normal (200) after 1010 s of waiting;
    # then it reserves the node and small jobs that would end later must keep off it
    profile = replace(BEST_FIT, aging_per_hour=360.0, backfill=True)
    report = simulate(
        starving_workload(), cluster(make_node("n1")), profile, config=SimConfig(tick_s=5.0)
    )
    assert report.outcome("large").first_start_s < 1200.0


def test_without_aging_and_backfill_the_large_job_starves():
    profile = replace(BEST_FIT, aging_per_hour=0.0, backfill=False)
    report = simulate(
        starving_workload(), cluster(make_node("n1")), profile, config=SimConfig(tick_s=5.0)
    )
    assert report.outcome("large").first_start_s >= 1975.0


def test_fair_share_between_tenants_over_time():
    # team-a floods 16 GPUs at t=0 (borrowing team-b's idle 8); team-b arrives at t=1 with
    # the same load and reclaims its 8 at once. From then on both run 8 at a time:
    # each team's 40 one-GPU jobs of 100 s take 5 rounds, so both finish by about 500 s.
    work = [job(f"a{i}", 0.0, 100.0, tenant="team-a", submitted_at=i) for i in range(40)]
    work += [job(f"b{i}", 1.0, 100.0, tenant="team-b", submitted_at=i) for i in range(40)]
    report = simulate(work, cluster(make_node("n1"), make_node("n2")), BEST_FIT)
    assert report.preemptions == 8
    assert report.jain_fairness == pytest.approx(1.0, abs=0.01)
    a, b = report.wait_by_tenant["team-a"], report.wait_by_tenant["team-b"]
    # b starts 8 jobs per round at 1, 101, ..., 401: waits 0, 100, ..., 400, median 200
    assert a.p50 == b.p50 == 200.0
    assert report.makespan_s == 501.0  # 5 rounds of 100 s from t=1


def test_a_cycle_latency_delays_decisions_and_what_happens_during_a_cycle():
    """With `cycle_latency_s` a cycle's decisions take effect that long after its snapshot,
    and what ends or arrives meanwhile waits for the next cycle: a daemon's latency."""
    work = [
        job("a", 0.0, 1.0, gpus=8, submitted_at=0.0),
        job("b", 0.1, 1.0, gpus=8, submitted_at=0.1),
        job("c", 1.1, 1.0, gpus=4, submitted_at=1.1),
    ]
    nodes = cluster(make_node("n1"), make_node("n2", gpus=4))
    instant = simulate(work, nodes, BEST_FIT)
    assert [instant.outcome(j).first_start_s for j in "abc"] == [0.0, 1.0, 1.1]
    config = SimConfig(cycle_latency_s=0.2)
    slow = simulate(work, nodes, BEST_FIT, config=config)
    # a: decided at 0, running at 0.2. b arrives while that cycle runs: decided at 0.2 (no
    # room), then waits. c arrives at 1.1: its cycle runs until 1.3, and a, ending at 1.2
    # meanwhile, frees n1 for the cycle at 1.3, so b runs from 1.5.
    assert slow.outcome("a").first_start_s == pytest.approx(0.2)
    assert slow.outcome("c").first_start_s == pytest.approx(1.3)
    assert slow.outcome("b").first_start_s == pytest.approx(1.5)
    assert slow.makespan_s == pytest.approx(2.5)


def test_borrowed_gpu_hours_count_what_a_tenant_holds_beyond_its_guarantee():
    # team-b (guarantee 8) runs 16 GPUs for 100 s while team-a is idle: 8 beyond for 100 s;
    # team-a's later 4 GPUs stay inside its guarantee of 8
    work = [
        job("b1", 0.0, 100.0, gpus=8, tenant="team-b"),
        job("b2", 0.0, 100.0, gpus=8, tenant="team-b", submitted_at=1),
        job("a1", 200.0, 50.0, gpus=4, tenant="team-a"),
    ]
    nodes = (make_node("n1"), make_node("n2"), make_node("n3"))
    report = simulate(work, cluster(*nodes), BEST_FIT)
    assert report.borrowed_gpu_hours == {"team-b": pytest.approx(8 * 100 / 3600)}
    assert report.gpu_hours_by_tenant == {
        "team-a": pytest.approx(4 * 50 / 3600),
        "team-b": pytest.approx(16 * 100 / 3600),
    }


def test_best_effort_jobs_borrow_nothing():
    # 16 GPUs for 100 s beyond team-b's guarantee of 8, on idle capacity outside quota
    work = [
        job(f"b{i}", 0.0, 100.0, gpus=8, tenant="team-b", priority="best-effort", submitted_at=i)
        for i in range(2)
    ]
    report = simulate(work, cluster(make_node("n1"), make_node("n2")), BEST_FIT)
    assert report.gpu_hours_by_tenant == {"team-b": pytest.approx(16 * 100 / 3600)}
    assert report.borrowed_gpu_hours == {}


def test_progress_is_told_after_every_cycle():

    heard: list[tuple[float, int]] = []
    work = [job(f"t{i}", 0.0, 100.0, gpus=8, submitted_at=i) for i in range(3)]
    simulation = Simulation(
        work,
        cluster(make_node("n1")),
        BEST_FIT,
        (),
        SimConfig(tick_s=1000.0),
        progress=lambda *a: heard.append(a),
    )
    report = simulation.run()
    # cycles at 0, 100 and 200 (each end frees the node for the next job; no tick is due)
    assert heard == [(0.0, 1), (100.0, 2), (200.0, 3)]
    assert report.cycles == 3


def test_the_allocation_series_drops_when_the_last_job_ends():
    # one 8-GPU job 0..100 and nothing after: 8 GPUs for 100 s, then none
    report = simulate([job("only", 0.0, 100.0, gpus=8)], cluster(make_node("n1")), BEST_FIT)
    assert report.allocation[-1] == (100.0, 0.0)
    assert time_average(report.allocation, 200.0) == pytest.approx(4.0)
