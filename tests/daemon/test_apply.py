"""Phase A (`scheduler.daemon.apply`): waiting reasons and their pace, written after the binds;
preemption waiting for its victims; a stale snapshot's conflicts."""

from __future__ import annotations

from typing import Any

from django.db import connection
from django.test.utils import CaptureQueriesContext

from scheduler.models import Allocation, GpuDevice, Job
from scheduler.snapshot.build import build_snapshot
from tests.daemon.conftest import Env, assert_consistent, low_priority_cluster


def test_waiting_job_gets_a_reason(env: Env) -> None:
    env.submit(resources={"gpus": 8}, simulation={"duration_s": 600})
    job = env.submit(replicas=4, resources={"gpus": 8})  # 8 + 32: over team-alpha's limit 32
    env.run(env.daemon())
    job.refresh_from_db()
    assert job.state == "queued"
    assert job.reason.startswith("quota"), job.reason


def test_waiting_reasons_are_refreshed_at_the_daemons_pace(env: Env) -> None:
    daemon = env.daemon(reasons_every_s=1.0)
    env.submit(resources={"gpus": 8}, simulation={"duration_s": 600})
    first = env.submit(replicas=4, resources={"gpus": 8})  # 8 + 32: over team-alpha's limit
    env.run(daemon)
    first.refresh_from_db()
    assert first.reason.startswith("quota")
    second = env.submit(replicas=4, resources={"gpus": 8})
    env.run(daemon, seconds=0.5)  # within the second: not rewritten yet
    second.refresh_from_db()
    assert second.reason == ""
    env.run(daemon, seconds=0.5)
    second.refresh_from_db()
    assert second.reason.startswith("quota")


def test_preemption_waits_for_victims_to_stop(env: Env) -> None:
    low, daemon = low_priority_cluster(env)
    assert Job.objects.filter(state="running").count() == 4
    urgent = env.submit(
        user="alice",
        resources={"gpus": 8},
        priority_class="critical",
        simulation={"duration_s": 60},
    )
    env.run(daemon)
    urgent.refresh_from_db()
    victims = [j for j in low if Job.objects.get(pk=j.pk).state == "preempted"]
    assert len(victims) == 1
    assert urgent.state == "queued" and "preempting" in urgent.reason
    assert_consistent(env.backend)
    env.run(daemon, seconds=3, cycles=2)
    urgent.refresh_from_db()
    assert urgent.state in ("binding", "running")
    victim = Job.objects.get(pk=victims[0].pk)
    assert (victim.state, victim.attempt) == ("queued", 1)
    assert_consistent(env.backend)
    # The engine learns who displaced whom, so the victim's retry cannot preempt it back.
    running = build_snapshot(env.clock(), decayed={}).snapshot.running
    guard = {r.job.id: r.displaced for r in running}
    assert guard[str(urgent.pk)] == (str(victim.pk),)


def test_stale_snapshot_conflict_requeues_only_the_conflicting_jobs(
    env: Env, monkeypatch: Any
) -> None:
    from django.utils import timezone

    import scheduler.daemon.loop as daemon_module
    from scheduler.models import AllocationDevice, Node

    jobs = [env.submit(resources={"gpus": 8}, simulation={"duration_s": 600}) for _ in range(4)]
    daemon = env.daemon()
    env.run(daemon, cycles=0)
    real = daemon_module.build_snapshot

    def stale(*args: Any, **kwargs: Any) -> Any:
        built = real(*args, **kwargs)  # then, behind the snapshot's back, a rogue holder:
        rogue = Allocation.objects.create(
            job=jobs[0],
            node=Node.objects.get(name="h100-0000"),
            attempt=9,
            replica=0,
            pod_name="rogue",
            namespace="x",
            started_at=timezone.now(),
        )
        for device in GpuDevice.objects.filter(node__name="h100-0000"):
            AllocationDevice.objects.create(allocation=rogue, device=device, milli=1000)
        return built

    monkeypatch.setattr(daemon_module, "build_snapshot", stale)
    daemon.step()
    states = sorted(Job.objects.filter(pk__in=[j.pk for j in jobs]).values_list("state", flat=True))
    assert states == ["binding", "binding", "binding", "queued"]
    conflicted = Job.objects.get(pk__in=[j.pk for j in jobs], state="queued")
    assert "conflicted" in conflicted.reason
    assert_consistent(env.backend)


def test_jobs_fitted_into_a_victims_leftover_wait_for_it_too(env: Env) -> None:
    """The engine frees a victim's 8 GPUs at once; the preemptor takes 4 and fits a second
    job into the other 4. Both wait until the victim's pod is gone, then start there."""
    low, daemon = low_priority_cluster(env)
    first, second = (
        env.submit(resources={"gpus": 4}, priority_class="critical", simulation={"duration_s": 60})
        for _ in range(2)
    )
    env.run(daemon)
    preempted = [j for j in low if Job.objects.get(pk=j.pk).state == "preempted"]
    assert len(preempted) == 1
    first.refresh_from_db()
    second.refresh_from_db()
    victim = preempted[0].pk
    assert (first.state, second.state) == ("queued", "queued")
    # the preemptor says so; the job fitted beside it waits for a job it did not preempt
    assert first.reason == f"preempting job(s) {victim}; starts when they have stopped"
    assert second.reason == f"waiting for job(s) {victim} to stop, preempted for other jobs"
    assert_consistent(env.backend)
    env.run(daemon, seconds=3, cycles=2)
    nodes = set()
    for job in (first, second):
        job.refresh_from_db()
        assert job.state in ("binding", "running")
        nodes.add(Allocation.objects.get(job=job, ended_at__isnull=True).node_id)
    assert len(nodes) == 1  # both on the victim's node
    assert_consistent(env.backend)


def test_reasons_are_written_after_the_placed_jobs_are_bound(env: Env) -> None:
    """Hundreds of waiting reasons must not delay the placed jobs' start: the claim
    transaction holds no reason write, and the reasons follow the binds."""
    placed = env.submit(simulation={"duration_s": 600})
    waiting = env.submit(replicas=4, resources={"gpus": 8})  # 4 + 32 over quota 32
    with CaptureQueriesContext(connection) as seen:
        env.run(env.daemon())
    sql = [q["sql"] for q in seen.captured_queries]
    claim, reason = (
        ("SET state = 'binding'", "SET reason = v.reason")
        if connection.vendor == "postgresql"
        else ("SET \"state\" = 'binding'", 'SET "reason" = \'quota')
    )
    binding = next(i for i, q in enumerate(sql) if claim in q)
    reasons = next(i for i, q in enumerate(sql) if reason in q)
    assert binding < reasons
    placed.refresh_from_db()
    waiting.refresh_from_db()
    assert placed.state == "binding" and waiting.reason.startswith("quota")
