"""The max runtime counts from the start of the current run: a job preempted after part of
its runtime and bound again is not failed for the time its earlier run took (the stored
`started_at` is the earlier run's until the new one starts)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from scheduler.backends.base import FailureReason, PodPhase, PodStatus
from scheduler.daemon.judge import judge
from scheduler.models import JobState

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
