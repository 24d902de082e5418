"""How a job enters the queue from outside the daemon: the one function for it.

A job is queued at submit (a new job, inserted queued) or when its approval is granted (a
transition from pending approval). Both go through `job_enqueue`: the queue time by the
lifecycle's rule (`job_timestamps`), the event, and the hook the other apps hear it by
(`scheduler.jobs.hooks.job_enqueued`: billing reserves the job's worst-case cost). A job the
daemon requeues (preempted, its node lost) is already known to those apps and does not come
through here.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from django.utils import timezone

from scheduler.jobs.hooks import job_enqueued
from scheduler.jobs.transitions import job_timestamps, job_transition
from scheduler.models import Job, JobEvent, JobState


def job_enqueue(
    job: Job,
    *,
    actor: Any,
    kind: str,
    message: str,
    data: dict[str, Any] | None = None,
    now: datetime | None = None,
) -> Job:
    """Put `job` in the queue inside the caller's transaction: insert it queued when it is new,
    or move it there from the state it was read in (a ConflictError if it moved meanwhile)."""
    now = now or timezone.now()
    if job.pk is None:
        job.state = JobState.QUEUED
        for field, value in job_timestamps(JobState.QUEUED, now).items():
            setattr(job, field, value)
        job.save()
        JobEvent.objects.create(
            job=job, kind=kind, to_state=job.state, actor=actor, message=message, data=data or {}
        )
    else:
        job = job_transition(
            job=job,
            to_state=JobState.QUEUED,
            actor=actor,
            kind=kind,
            message=message,
            data=data,
            now=now,
        )
    job_enqueued(job)
    return job
