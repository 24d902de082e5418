"""One way into the queue (issue 36): submit and approval both go through `job_enqueue`, which
stamps the queue time, records the event and tells the apps that hear of it once."""

from __future__ import annotations

from typing import Any

import pytest

from scheduler.jobs import approvals, enqueue, hooks, services
from scheduler.jobs.services import job_submit
from scheduler.models import Job, JobEvent, JobState
from tenants import approvals as tenant_approvals
from tenants.approvals import approval_decide
from tenants.models import ApprovalPolicy, ApprovalRequest
from tests.conftest import Org, job_spec


@pytest.fixture
def heard(monkeypatch: pytest.MonkeyPatch) -> list[tuple[int, str, bool]]:
    """Every job the enqueued hooks hear of: (id, state, queue time set), billing's included."""
    seen: list[tuple[int, str, bool]] = []
    monkeypatch.setattr(
        hooks,
        "_enqueued",
        [*hooks._enqueued, lambda job: seen.append((job.pk, job.state, job.queued_at is not None))],
    )
    monkeypatch.setattr(tenant_approvals, "enqueue_notification", lambda *a, **k: None)
    return seen


@pytest.fixture
def through(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Which callers went through `job_enqueue`."""
    calls: list[str] = []
    real = enqueue.job_enqueue

    def spy(job: Job, **kwargs: Any) -> Job:
        calls.append(kwargs["kind"])
        return real(job, **kwargs)

    monkeypatch.setattr(services, "job_enqueue", spy)
    monkeypatch.setattr(approvals, "job_enqueue", spy)
    return calls


def _submit(org: Org) -> Job:
    job, _ = job_submit(user=org.users["alice"], project=org.proj_alpha, payload=job_spec())
    return job


def test_a_submitted_job_enters_the_queue_through_the_one_function(
    org: Org, heard: list[tuple[int, str, bool]], through: list[str]
) -> None:
    job = _submit(org)
    assert through == ["submitted"]
    assert heard == [(job.pk, JobState.QUEUED, True)]
    job.refresh_from_db()
    event = JobEvent.objects.get(job=job, kind="submitted")
    assert (job.state, event.to_state) == (JobState.QUEUED, JobState.QUEUED)
    assert job.queued_at is not None


def test_an_approved_job_enters_the_queue_through_the_same_function_once(
    org: Org, heard: list[tuple[int, str, bool]], through: list[str]
) -> None:
    ApprovalPolicy.objects.create(tenant=org.alpha, rule="gpus_over", threshold=0)
    job = _submit(org)
    assert (job.state, through, heard) == (JobState.PENDING_APPROVAL, [], [])
    job.refresh_from_db()
    assert job.queued_at is None
    request = ApprovalRequest.objects.get(kind="job", subject_id=job.pk)
    approval_decide(user=org.users["tina"], request=request, approve=True, comment="")
    assert through == ["approved"]
    assert heard == [(job.pk, JobState.QUEUED, True)]
    job.refresh_from_db()
    assert job.state == JobState.QUEUED and job.queued_at is not None
