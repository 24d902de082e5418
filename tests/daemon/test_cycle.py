"""One job's life through the daemon's cycles: placed, bound, running, finished; seen started
and finished at once. The phases' own tests sit with their modules (test_snapshot,
test_cache, test_queue, test_apply, test_store, test_reconcile, test_judge, test_lease,
test_upkeep)."""

from __future__ import annotations

from django.db import connection
from django.test.utils import CaptureQueriesContext

from scheduler.models import Allocation, AllocationDevice, GpuDevice, Job, JobEvent
from tests.daemon.conftest import Env, assert_consistent


def states(job: Job) -> list[str]:
    return list(JobEvent.objects.filter(job=job).values_list("to_state", flat=True))


def test_job_is_placed_bound_run_and_finished(env: Env) -> None:
    job = env.submit(replicas=2, resources={"gpus": 4}, simulation={"duration_s": 60})
    daemon = env.daemon()
    env.run(daemon)
    job.refresh_from_db()
    assert job.state == "binding"
    pods = {p.name: p for p in env.backend.list_pods()}
    assert set(pods) == {f"gantry-{job.pk}-a0-r0", f"gantry-{job.pk}-a0-r1"}
    assert all(p.node for p in pods.values())
    assert_consistent(env.backend)
    bound = Allocation.objects.filter(job=job).values_list("bound_at", flat=True)
    assert len(bound) == 2 and None not in bound
    env.run(daemon, seconds=2)
    job.refresh_from_db()
    assert job.state == "running"
    # 2 x 4 GPUs = 8 devices fully held
    assert sum(GpuDevice.objects.values_list("allocated_milli", flat=True)) == 8000
    env.run(daemon, seconds=60)
    job.refresh_from_db()
    assert job.state == "succeeded"
    assert states(job) == ["queued", "admitted", "binding", "running", "succeeded"]
    assert not Allocation.objects.filter(ended_at__isnull=True).exists()
    assert set(Allocation.objects.values_list("end_reason", flat=True)) == {"attempt ended"}
    assert not AllocationDevice.objects.filter(released=False).exists()
    assert sum(GpuDevice.objects.values_list("allocated_milli", flat=True)) == 0
    env.run(daemon)
    assert env.backend.list_pods() == []


def test_a_job_seen_started_and_finished_at_once_is_one_write_with_both_events(
    env: Env,
) -> None:
    job = env.submit(simulation={"duration_s": 1})
    daemon = env.daemon()
    env.run(daemon)  # placed and bound
    with CaptureQueriesContext(connection) as seen:
        env.run(daemon, seconds=5)  # the pod started and finished in between
    job.refresh_from_db()
    assert job.state == "succeeded" and job.started_at is not None
    assert states(job) == ["queued", "admitted", "binding", "running", "succeeded"]
    writes = [
        q["sql"]
        for q in seen.captured_queries
        if q["sql"].startswith(('UPDATE "scheduler_job" ', "UPDATE scheduler_job "))
    ]
    assert len(writes) == 1, writes
    assert_consistent(env.backend)
