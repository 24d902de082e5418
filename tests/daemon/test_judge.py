"""Reconcile's verdicts per job (`scheduler.daemon.judge`): retries with backoff, the pod's
failure reason deciding a retry, the max runtime, and the requeue sweep of preempted jobs.

The max runtime counts from the start of the current run: a job preempted after part of
its runtime and bound again is not failed for the time its earlier run took (the stored
`started_at` is the earlier run's until the new one starts)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from scheduler.backends.base import FailureReason, PodPhase, PodStatus
from scheduler.daemon.judge import judge
from scheduler.models import Allocation, Job, JobEvent, JobState
from tests.daemon.conftest import Env, assert_consistent

NOW = datetime(2026, 12, 4, 12, 0, tzinfo=UTC)


def _job(state: str) -> dict[str, Any]:
    # max runtime 60 s; the earlier run started 100 s ago
    return {
        "id": 7,
        "state": state,
        "max_runtime_s": 60,
        "started_at": NOW - timedelta(seconds=100),
    }


def _allocs() -> list[dict[str, Any]]:
    return [
        {
            "id": 1,
            "pod_name": "gantry-7-a1-r0",
            "namespace": "team-a",
            "node__name": "gpu-1",
            "node__ready": True,
            "node__present": True,
            "elastic": False,
            "bound_at": NOW - timedelta(seconds=5),
        }
    ]


def _pods(phase: PodPhase) -> dict[str, PodStatus]:
    pod = PodStatus("gantry-7-a1-r0", "team-a", 7, 1, 0, "gpu-1", phase)
    return {pod.name: pod}


def test_a_rebound_job_is_not_failed_for_its_earlier_runs_time() -> None:
    verdict = judge(
        _job(JobState.BINDING), _allocs(), _pods(PodPhase.PENDING), set(), NOW, timedelta(minutes=5)
    )
    assert verdict.failure is None


def test_a_rebound_job_whose_pod_just_started_is_not_failed_either() -> None:
    verdict = judge(
        _job(JobState.BINDING), _allocs(), _pods(PodPhase.RUNNING), set(), NOW, timedelta(minutes=5)
    )
    assert verdict.failure is None and verdict.start


def test_a_running_job_past_its_max_runtime_still_fails() -> None:
    verdict = judge(
        _job(JobState.RUNNING), _allocs(), _pods(PodPhase.RUNNING), set(), NOW, timedelta(minutes=5)
    )
    assert verdict.failure is not None and verdict.failure[0] == FailureReason.DEADLINE_EXCEEDED


@pytest.mark.parametrize(
    ("state", "phase", "idle"),
    [
        (JobState.RUNNING, PodPhase.RUNNING, True),  # goes on as it is
        (JobState.BINDING, PodPhase.PENDING, True),  # within its binding deadline
        (JobState.BINDING, PodPhase.RUNNING, False),  # started
        (JobState.RUNNING, PodPhase.SUCCEEDED, False),
        (JobState.RUNNING, PodPhase.FAILED, False),
    ],
)
def test_only_verdicts_with_something_to_do_are_not_idle(
    state: str, phase: PodPhase, idle: bool
) -> None:
    """Reconcile hands on only the verdicts that are not idle: most running jobs, most
    cycles, have nothing to write."""
    job = {**_job(state), "max_runtime_s": 0}
    verdict = judge(job, _allocs(), _pods(phase), set(), NOW, timedelta(minutes=5))
    assert verdict.idle is idle, verdict


def test_failed_attempt_retries_with_backoff_then_fails(env: Env) -> None:
    job = env.submit(
        simulation={"duration_s": 10, "fail": True}, retry={"limit": 1, "backoff_s": 30}
    )
    daemon = env.daemon()
    env.run(daemon, cycles=2)
    env.run(daemon, seconds=12)
    job.refresh_from_db()
    assert (job.state, job.attempt) == ("queued", 1)
    assert "retry in 30 s" in job.reason
    env.run(daemon, seconds=5)  # inside the backoff: not placed
    job.refresh_from_db()
    assert job.state == "queued"
    env.run(daemon, seconds=30, cycles=2)
    env.run(daemon, seconds=12)
    job.refresh_from_db()
    assert job.state == "failed"
    assert "exited with an error" in job.reason
    assert_consistent(env.backend)


@pytest.mark.parametrize(
    ("reason", "limit", "final_state", "text"),
    [
        (FailureReason.OOM_KILLED, 1, "queued", "OOMKilled"),
        (FailureReason.OOM_KILLED, 0, "failed", "OOMKilled"),
        (FailureReason.IMAGE_PULL, 3, "failed", "image pull"),
        (FailureReason.EVICTED, 0, "queued", "Evicted"),
        (FailureReason.NODE_LOST, 0, "queued", "node lost"),
        (FailureReason.DEADLINE_EXCEEDED, 3, "failed", "deadline"),
    ],
    ids=[
        "oom-retried",
        "oom-no-retries-left",
        "image-pull-final",
        "evicted-infra",
        "node-lost-infra",
        "deadline-final",
    ],
)
def test_pod_failure_reason_decides_retry(
    env: Env, reason: FailureReason, limit: int, final_state: str, text: str
) -> None:
    job = env.submit(retry={"limit": limit, "backoff_s": 10}, simulation={"duration_s": 100})
    daemon = env.daemon()
    env.run(daemon, seconds=2, cycles=2)
    env.backend.fail_pod(f"gantry-{job.pk}-a0-r0", reason, "from the test")
    env.run(daemon)
    job.refresh_from_db()
    event = JobEvent.objects.filter(job=job, kind="attempt_failed").get()
    assert text in event.message
    if final_state == "failed":
        assert job.state == "failed" and text in job.reason
        assert not Allocation.objects.filter(job=job, ended_at__isnull=True).exists()
    else:  # requeued with a new attempt (infra failures at once, so maybe placed again)
        assert event.to_state == "queued" and job.attempt == 1
        assert not Allocation.objects.filter(job=job, attempt=0, ended_at__isnull=True).exists()
    assert_consistent(env.backend)


def test_job_past_max_runtime_is_stopped(env: Env) -> None:
    job = env.submit(max_runtime_s=60, simulation={"duration_s": 1000})
    daemon = env.daemon()
    env.run(daemon, seconds=2, cycles=2)
    env.run(daemon, seconds=61)
    job.refresh_from_db()
    assert job.state == "failed"
    assert "max runtime" in job.reason
    env.run(daemon, seconds=3, cycles=2)
    assert env.backend.list_pods() == []


def test_a_preempted_job_with_nothing_running_is_requeued_by_the_sweep(env: Env) -> None:
    """Requeueing after preemption is checked for the jobs whose last allocation ended in
    the cycle, and for every preempted job every few seconds (level-based)."""
    job = env.submit()
    Job.objects.filter(pk=job.pk).update(state="preempted", reason="preempted: test")
    daemon = env.daemon()
    env.run(daemon)  # the first cycle sweeps (and places the job again)
    job.refresh_from_db()
    assert job.attempt == 1 and job.state in ("queued", "admitted", "binding")
    assert JobEvent.objects.filter(job=job, message__startswith="Back in the queue").exists()
    again = env.submit()
    Job.objects.filter(pk=again.pk).update(state="preempted")
    env.run(daemon, seconds=0.5)  # not due yet
    assert Job.objects.get(pk=again.pk).state == "preempted"
    env.run(daemon, seconds=2.0)
    assert Job.objects.get(pk=again.pk).attempt == 1
