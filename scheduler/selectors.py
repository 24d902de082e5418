"""Reads on jobs, scoped to what the user may see."""

from __future__ import annotations

from typing import Any

from django.db.models import QuerySet
from django.http import Http404

from scheduler.models import Job, JobEvent
from tenants import access


def job_list_visible(user: Any) -> QuerySet[Job]:
    jobs = Job.objects.select_related("project", "tenant", "priority_class", "submitted_by")
    return access.visible_by_tenant(user, jobs)


def access_job(user: Any, job_id: Any) -> Job:
    """The job if the user may see it, else 404 (never 403: ids reveal nothing)."""
    try:
        return job_list_visible(user).get(pk=int(job_id))
    except (ValueError, TypeError, Job.DoesNotExist):
        raise Http404("Not found.") from None


def job_event_list(job: Job) -> QuerySet[JobEvent]:
    return job.events.select_related("actor").order_by("at", "id")
