"""Issue 35 through the daemon: after a node failure, a requeued job that reclaims its
team's guarantee does not start a preemption livelock (the issue saw 21 preemptions in 44 s,
one email each): the room its victim frees is held for it (`Snapshot.nominated`); a small
inference job at its type's default class spares its team's training."""

from __future__ import annotations

from typing import Any

from scheduler.jobs.services import job_submit
from scheduler.models import Allocation, Job, JobEvent
from scheduler.nodes.services import node_set_failed
from tenants.models import Quota
from tests.conftest import job_spec
from tests.daemon.conftest import Env, assert_consistent


def test_after_a_node_failure_the_room_reclaimed_is_held_for_the_job_that_reclaimed_it(
    env: Env,
) -> None:
    # Issue 35's livelock, through the daemon. 4 nodes of 8 and guarantees of 32 (alpha 8,
    # bravo 4, charlie 12, 8 unassigned): after a node fails, more is promised than runs.
    # bravo ("vision") runs an 8-GPU job on 4 guaranteed (borrowing 4) and queues three more
    # at high priority; charlie ("search") runs 8 + 4 (its guarantee, 12), with a 3 x 8 gang
    # at high priority at the head of its queue. The node of charlie's 4-GPU job fails: the
    # job is requeued within charlie's guarantee and reclaims bravo's running job. When that
    # job's pods are gone, bravo's queue head ranks before charlie's (both borrow, both high,
    # bravo's share is lower): without a hold on the freed room it takes it, is preempted
    # again at once (not started, nothing protects it), and the next one takes it: on the
    # code of bf40e3b, 4 preemptions alternating with 4 admissions, one email each.
    org = env.org
    for tenant, guaranteed in [
        (org.alpha, 8),
        (org.bravo, 4),
        (org.charlie, 12),
        (org.research, 12),
        (org.product, 12),
        (org.acme, 32),
    ]:  # children first: a parent's guarantee covers its children's
        Quota.objects.filter(tenant=tenant, flavor=org.h100).update(
            guaranteed_milli=guaranteed * 1000
        )
    daemon = env.daemon()
    running = submit(env, "bob-bravo", gpus=8, priority_class="high")
    env.run(daemon, seconds=2, cycles=2)
    submit(env, "chris", gpus=8)
    submit(env, "alice", gpus=8)
    reclaimer = submit(env, "chris", gpus=4)
    env.run(daemon, seconds=2, cycles=3)
    submit(env, "chris", gpus=8, replicas=3, priority_class="high")
    queued = [submit(env, "bob-bravo", gpus=8, priority_class="high") for _ in range(3)]
    env.run(daemon, seconds=400, cycles=1)  # past the minimum runtime
    env.run(daemon, seconds=2, cycles=2)
    assert Job.objects.get(pk=running.pk).state == "running"
    assert {j.state for j in Job.objects.filter(pk__in=[j.pk for j in queued])} == {"queued"}

    failed = Allocation.objects.get(job=reclaimer, ended_at__isnull=True).node
    node_set_failed(user=org.users["pat"], node=failed, failed=True)
    env.run(daemon, seconds=2, cycles=30)  # a simulated minute

    preempted = list(JobEvent.objects.filter(kind="preempted").values_list("job_id", flat=True))
    assert preempted == [running.pk]
    reclaimer.refresh_from_db()
    assert reclaimer.state == "running"
    assert Job.objects.filter(pk__in=[j.pk for j in queued], attempt__gt=0).count() == 0
    assert_consistent(env.backend)


def submit(env: Env, user: str, *, gpus: int, replicas: int = 1, **spec: Any) -> Job:
    project = {"alice": env.org.proj_alpha, "bob-bravo": env.org.proj_bravo}.get(
        user, env.org.proj_charlie
    )
    payload = job_spec(
        replicas=replicas, resources={"gpus": gpus}, simulation={"duration_s": 100_000}, **spec
    )
    job, _ = job_submit(user=env.org.users[user], project=project, payload=payload)
    return job


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
