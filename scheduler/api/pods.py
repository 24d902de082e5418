"""`/api/v1/jobs/{id}/pods/` (where the job runs and ran) and `/api/v1/jobs/{id}/logs/`
(a pod's log, read by tail or by cursor). Both are scoped like the job: another team's job
is a 404. Logs are narrower still (`access_job_logs`): finance without a role on the job's
tenant sees the job and its pods but gets a 404 for its logs."""

from __future__ import annotations

from typing import Any

from django.utils import timezone
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema
from rest_framework import generics, serializers, status
from rest_framework.exceptions import ValidationError
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from common.api.schema import ERROR_SCHEMA
from scheduler.backends.base import BackendError
from scheduler.clusters.backends import log_source
from scheduler.jobs import pods as pod_logs
from scheduler.jobs import selectors
from scheduler.models import Allocation

JOB_ID = OpenApiParameter("id", int, OpenApiParameter.PATH, description="Job id.")


class PodDeviceOut(serializers.Serializer):
    index = serializers.IntegerField(source="device.index", help_text="GPU index on the node.")
    model = serializers.CharField(source="device.model")
    share_milli = serializers.IntegerField(
        source="milli", help_text="Share of the device: 1000 whole, less for a fractional job."
    )
    memory_mib = serializers.IntegerField(help_text="Device memory granted (0: not limited).")


class PodOut(serializers.Serializer):
    """One replica of one attempt on its node: an allocation of the job."""

    pod = serializers.CharField(source="pod_name")
    namespace = serializers.CharField()
    attempt = serializers.IntegerField()
    replica = serializers.IntegerField()
    node = serializers.CharField(source="node.name")
    flavor = serializers.CharField()
    gpu_milli = serializers.IntegerField(help_text="GPU milli of this replica (1000 = 1 GPU).")
    devices = PodDeviceOut(many=True)
    started_at = serializers.DateTimeField(help_text="When the pod was placed on the node.")
    bound_at = serializers.DateTimeField(allow_null=True, help_text="When it was bound.")
    ended_at = serializers.DateTimeField(allow_null=True, help_text="Null while it runs.")
    end_reason = serializers.CharField()
    active = serializers.SerializerMethodField()

    def get_active(self, pod: Allocation) -> bool:
        return pod.ended_at is None


class JobPodsView(generics.GenericAPIView):
    """Every pod the job has had, the latest attempt first: node, GPU devices (index, model,
    the share of each for fractional jobs), when it was placed, bound and ended, and why."""

    serializer_class = PodOut
    filter_backends: list[Any] = []

    @extend_schema(operation_id="jobs_pods_list", parameters=[JOB_ID], responses=PodOut(many=True))
    def get(self, request: Request, pk: str) -> Response:
        job = selectors.access_job(request.user, pk)
        page = self.paginate_queryset(pod_logs.job_pod_list(job))  # type: ignore[arg-type]
        return self.get_paginated_response(PodOut(page, many=True).data)


class JobLogQueryIn(serializers.Serializer):
    replica = serializers.IntegerField(default=0, min_value=0, max_value=100_000)
    attempt = serializers.IntegerField(
        required=False, min_value=0, max_value=1_000_000, help_text="Default: the latest."
    )
    tail = serializers.IntegerField(
        required=False,
        min_value=1,
        max_value=pod_logs.MAX_TAIL,
        help_text=f"The last N lines (default {pod_logs.DEFAULT_TAIL}); ignored with `since`.",
    )
    since = serializers.CharField(
        required=False, max_length=200, help_text="A `cursor` from an earlier answer."
    )


class LogLineOut(serializers.Serializer):
    at = serializers.DateTimeField(allow_null=True, help_text="When the line was written.")
    text = serializers.CharField()


class JobLogOut(serializers.Serializer):
    """No pod yet (a job still queued) is not an error: `lines` is empty, `pod` null and
    `message` says why; poll again with the same request."""

    job = serializers.IntegerField()
    state = serializers.CharField()
    pod = serializers.CharField(allow_null=True)
    attempt = serializers.IntegerField(allow_null=True)
    replica = serializers.IntegerField()
    node = serializers.CharField(allow_null=True)
    lines = LogLineOut(many=True)
    cursor = serializers.CharField(
        help_text="Pass as `since` to get only the lines after these ('' : none read yet)."
    )
    done = serializers.BooleanField(
        help_text="The pod has ended and every line is in: following can stop."
    )
    message = serializers.CharField(help_text="Why there are no lines, when there are none.")


class JobLogsView(APIView):
    """A pod's log: the last `tail` lines, or the lines after `since` (the `cursor` of the
    previous answer), to follow a running pod by polling. A pod that is gone or has not
    started answers no lines and a `message`; a cluster that cannot be reached is a 503."""

    @extend_schema(
        operation_id="jobs_logs_retrieve",
        parameters=[JOB_ID, JobLogQueryIn],
        responses={
            200: JobLogOut,
            503: OpenApiResponse(ERROR_SCHEMA, description="The cluster could not be asked."),
        },
    )
    def get(self, request: Request, pk: str) -> Response:
        job = selectors.access_job_logs(request.user, pk)
        query = JobLogQueryIn(data=request.query_params.dict())
        query.is_valid(raise_exception=True)
        unknown = sorted(set(request.query_params) - set(query.fields))
        if unknown:
            raise ValidationError({key[:64]: ["unknown parameter."] for key in unknown[:20]})
        data = query.validated_data
        try:
            log = pod_logs.job_log_read(
                job=job,
                source=log_source(),
                now=timezone.now(),
                replica=data["replica"],
                attempt=data.get("attempt"),
                tail=data.get("tail"),
                cursor=data.get("since", ""),
            )
        except BackendError as exc:
            detail = f"the cluster could not be asked for the log: {exc}"
            return Response({"detail": detail}, status=status.HTTP_503_SERVICE_UNAVAILABLE)
        body = {
            "job": job.pk,
            "state": job.state,
            "pod": log.pod.pod_name if log.pod else None,
            "attempt": log.pod.attempt if log.pod else None,
            "replica": data["replica"],
            "node": log.pod.node.name if log.pod else None,
            "lines": log.lines,
            "cursor": log.cursor,
            "done": log.done,
            "message": log.message,
        }
        return Response(JobLogOut(body).data)
