"""`/api/v1/queue/`: your waiting jobs in one answer (`gantry queue`): each one's position in
its team's queue and the cluster's order, why it waits, and its expected start, as the
scheduler last worked them out. The per-job `/jobs/{id}/queue/` adds the jobs ahead."""

from __future__ import annotations

from typing import Any

from django.db.models import F
from django.utils import timezone
from drf_spectacular.utils import extend_schema
from rest_framework import generics, serializers
from rest_framework.request import Request
from rest_framework.response import Response

from scheduler.jobs.reasons import ReasonReader
from scheduler.jobs.selectors import job_list_visible
from scheduler.models import Job, JobState

WAITING = (JobState.QUEUED, JobState.PENDING_APPROVAL)


class QueuedJobOut(serializers.Serializer):
    id = serializers.IntegerField()
    name = serializers.CharField()
    state = serializers.CharField()
    tenant_slug = serializers.CharField()
    project_slug = serializers.CharField()
    position_tenant = serializers.IntegerField(
        allow_null=True, help_text="1 = next of its team's jobs; null: not placed in order yet."
    )
    position_cluster = serializers.IntegerField(allow_null=True)
    reason = serializers.CharField(help_text="Why it waits; jobs of other teams not named.")
    eta_p50 = serializers.DateTimeField(allow_null=True)
    eta_p90 = serializers.DateTimeField(allow_null=True)
    estimated_at = serializers.DateTimeField(
        allow_null=True, help_text="When the estimate was made; null: not estimated yet."
    )
    now = serializers.DateTimeField(help_text="The server's time of this answer.")


def _row(job: Job, reasons: ReasonReader, now: Any) -> dict[str, Any]:
    estimate = getattr(job, "queue_estimate", None) if job.state == JobState.QUEUED else None
    return {
        "id": job.pk,
        "name": job.name,
        "state": job.state,
        "tenant_slug": job.tenant.slug,
        "project_slug": job.project.slug,
        "position_tenant": estimate.position_tenant if estimate else None,
        "position_cluster": estimate.position_cluster if estimate else None,
        "reason": reasons.text(job.reason),
        "eta_p50": estimate.eta_p50 if estimate else None,
        "eta_p90": estimate.eta_p90 if estimate else None,
        "estimated_at": estimate.estimated_at if estimate else None,
        "now": now,
    }


class QueueListView(generics.GenericAPIView):
    """Your jobs that wait (queued, or waiting for approval), next to start first: a bounded
    number of queries per page, whatever the number of jobs."""

    serializer_class = QueuedJobOut

    def get_queryset(self) -> Any:
        return (
            job_list_visible(self.request.user)
            .filter(submitted_by_id=self.request.user.pk, state__in=WAITING)
            .select_related("queue_estimate")
            .order_by(F("queue_estimate__position_cluster").asc(nulls_last=True), "id")
        )

    @extend_schema(responses=QueuedJobOut(many=True))
    def get(self, request: Request) -> Response:
        page = self.paginate_queryset(self.get_queryset())
        jobs = list(page if page is not None else self.get_queryset())
        reasons = ReasonReader(request.user, [job.reason for job in jobs])
        now = timezone.now()
        data = QueuedJobOut([_row(job, reasons, now) for job in jobs], many=True).data
        return self.get_paginated_response(data) if page is not None else Response(data)
