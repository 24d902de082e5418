"""Issue 35 through the daemon: after a node failure, a requeued job that reclaims its
team's guarantee does not start a preemption livelock (the issue saw 21 preemptions in 44 s,
one email each); a small inference job at its type's default class spares its team's
training."""

from __future__ import annotations

from scheduler.models import Allocation, JobEvent
from scheduler.nodes.services import node_set_failed
from tests.daemon.conftest import Env


def test_a_node_failure_leads_to_a_bounded_number_of_preemptions(env: Env) -> None:
    # 4 nodes of 8 (the quota's guarantees count 64: as after a failure, more is promised
    # than runs). team-bravo ("vision") runs three 8-GPU jobs and team-alpha ("nlp") a
    # 1-GPU notebook beside 7 of bravo's 1-GPU jobs; the notebook's node fails: the notebook
    # and bravo's small jobs are requeued, and the notebook reclaims from bravo.
    daemon = env.daemon()
    daemon.profile = type(daemon.profile)(min_runtime_s=0)
    run = {"duration_s": 100_000}
    for _ in range(3):
        env.submit("bob-bravo", resources={"gpus": 8}, simulation=run)
    env.run(daemon, seconds=2, cycles=2)
    notebook = env.submit("alice", resources={"gpus": 1}, type="interactive", simulation=run)
    for _ in range(7):
        env.submit("bob-bravo", resources={"gpus": 1}, simulation=run)
    env.run(daemon, seconds=2, cycles=2)
    failed = Allocation.objects.get(job=notebook, ended_at__isnull=True).node
    node_set_failed(user=env.org.users["pat"], node=failed, failed=True)
    env.run(daemon, seconds=4, cycles=15)  # a simulated minute
    preempted = list(JobEvent.objects.filter(kind="preempted").values_list("job_id", flat=True))
    assert len(preempted) <= 1, preempted
    notebook.refresh_from_db()
    assert notebook.state == "running"


def test_a_fractional_inference_job_at_its_default_priority_spares_its_teams_training(
    env: Env,
) -> None:
    # Issue 35: a 0.5-GPU inference job at its type's default (high) preempted a 6-GPU
    # training job (normal) of its own team. The cluster full of alice's training jobs
    # (team-alpha), she submits a 0.5-GPU inference job without a class: it waits.
    daemon = env.daemon()
    daemon.profile = type(daemon.profile)(min_runtime_s=0)
    run = {"duration_s": 100_000}
    training = [
        env.submit(resources={"gpus": 8}, simulation=run, type="training") for _ in range(4)
    ]
    env.run(daemon, seconds=2, cycles=2)
    inference = env.submit(
        resources={"gpu_milli": 500, "gpu_memory_mib": 20000}, type="inference", simulation=run
    )
    assert inference.priority_class.name == "high"
    assert {j.priority_class.name for j in training} == {"normal"}
    env.run(daemon, seconds=2, cycles=3)
    assert not JobEvent.objects.filter(kind="preempted").exists()
    inference.refresh_from_db()
    assert inference.state == "queued"
