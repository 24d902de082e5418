"""`/api/v1/jobs/{id}/queue/`: where a waiting job stands, as its viewer may see it."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from django.utils import timezone
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import serializers
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from scheduler.jobs import selectors
from scheduler.jobs.reasons import ReasonReader
from scheduler.models import Job, JobState


class QueueAheadOut(serializers.Serializer):
    id = serializers.IntegerField()
    name = serializers.CharField()
    tenant_slug = serializers.CharField()
    position_cluster = serializers.IntegerField()


class JobQueueOut(serializers.Serializer):
    """Null positions and times when the job does not wait in the queue (or the scheduler
    has not placed it in its order yet)."""

    job = serializers.IntegerField()
    state = serializers.CharField()
    waiting = serializers.BooleanField(
        help_text="Queued (waiting to start), as soon as it is queued or requeued; its "
        "positions are null until the scheduler has placed it in its order (`position_note`)."
    )
    position_note = serializers.CharField(
        allow_null=True,
        help_text="Why a waiting job has no position yet; null when it has one or does not wait.",
    )
    position_tenant = serializers.IntegerField(
        allow_null=True, help_text="1 = next of its team's jobs, in the scheduler's order."
    )
    position_cluster = serializers.IntegerField(
        allow_null=True, help_text="1 = next of all queued jobs, in the scheduler's order."
    )
    ahead_count = serializers.IntegerField(allow_null=True, help_text="Queued jobs ahead.")
    ahead_visible = serializers.IntegerField(
        allow_null=True, help_text="Of those, jobs you may see (the nearest are in `ahead`)."
    )
    ahead_hidden = serializers.IntegerField(
        allow_null=True, help_text="Of those, jobs of teams you may not see: counted only."
    )
    ahead = QueueAheadOut(many=True)
    reason = serializers.CharField(help_text="Why it waits; jobs of other teams not named.")
    eta_p50 = serializers.DateTimeField(
        allow_null=True, help_text="Expected start if jobs take their usual (median) time."
    )
    eta_p90 = serializers.DateTimeField(
        allow_null=True, help_text="Expected start if jobs take as long as 9 in 10 do."
    )
    estimated_at = serializers.DateTimeField(
        allow_null=True, help_text="When the estimate was made; null: not estimated yet."
    )
    computed_at = serializers.DateTimeField(
        allow_null=True, help_text="When the positions were worked out."
    )
    now = serializers.DateTimeField(
        help_text="The server's time of this answer: say 'starts in about X' from it, not "
        "from a client clock that may be off."
    )


def server_now() -> datetime:
    return timezone.now()


def queue_data(user: Any, job: Job) -> dict[str, Any]:
    position = selectors.job_queue_position(user, job)
    reason = ReasonReader(user, [job.reason]).text(job.reason)
    data: dict[str, Any] = {"job": job.pk, "state": job.state, "reason": reason, "ahead": []}
    data["now"] = server_now()
    if position is None:
        # A queued job waits from the moment it is queued, stored position or not (after a
        # requeue the daemon stores one at its next refresh).
        keys = ["position_tenant", "position_cluster", "ahead_count", "ahead_visible"]
        keys += ["ahead_hidden", "eta_p50", "eta_p90", "estimated_at", "computed_at"]
        note = selectors.job_queue_note(job)
        waiting = job.state == JobState.QUEUED
        return {**data, "waiting": waiting, "position_note": note, **dict.fromkeys(keys)}
    ahead = [
        {
            "id": other.pk,
            "name": other.name,
            "tenant_slug": other.tenant.slug,
            "position_cluster": other.queue_estimate.position_cluster,
        }
        for other in position.ahead
    ]
    return {
        **data,
        "waiting": True,
        "position_note": None,
        "ahead": ahead,
        "position_tenant": position.position_tenant,
        "position_cluster": position.position_cluster,
        "ahead_count": position.ahead_count,
        "ahead_visible": position.ahead_visible,
        "ahead_hidden": position.ahead_hidden,
        "eta_p50": position.eta_p50,
        "eta_p90": position.eta_p90,
        "estimated_at": position.estimated_at,
        "computed_at": position.computed_at,
    }


class JobQueueView(APIView):
    """Position in the team's queue and the cluster's order, the jobs ahead (those of
    teams you may not see only counted), why it waits, and its expected start (p50..p90),
    as the scheduler last worked them out (every GANTRY_ETA_EVERY_S)."""

    @extend_schema(
        responses=JobQueueOut,
        operation_id="jobs_queue_retrieve",
        parameters=[OpenApiParameter("id", int, OpenApiParameter.PATH, description="Job id.")],
    )
    def get(self, request: Request, pk: str) -> Response:
        job = selectors.access_job(request.user, pk)
        return Response(JobQueueOut(queue_data(request.user, job)).data)
