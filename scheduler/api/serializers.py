"""Job API serializers. The submitted spec is validated by `scheduler.jobs.spec`."""

from __future__ import annotations

from typing import Any, cast

from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from common.api.serializers import StrictInputSerializer
from scheduler.jobs.reasons import ReasonReader
from scheduler.models import Job, JobEvent


def _reader(serializer: serializers.Serializer, texts: Any) -> ReasonReader:
    """One reader per response (a list shares its child's context): the ids of the jobs its
    texts mention are checked against the viewer's access in one query."""
    context = cast(dict[str, Any], serializer.context)
    reader = context.get("reason_reader")
    if reader is None:
        request = context.get("request")
        user = getattr(request, "user", None)
        root = serializer.root
        items = (
            root.instance if isinstance(root, serializers.ListSerializer) else [serializer.instance]
        )
        reader = context["reason_reader"] = ReasonReader(user, texts(items or []))
    return reader


class OriginOut(serializers.Serializer):
    """A workload created in Kubernetes that Gantry queued (docs/kubernetes-native.md)."""

    kind = serializers.CharField(help_text="Job or Pod.")
    api_version = serializers.CharField()
    namespace = serializers.CharField()
    name = serializers.CharField(help_text="The Job, the pod, or the pod group's name.")
    uid = serializers.CharField()
    pods = serializers.ListField(child=serializers.CharField(), required=False)


def origin_of(job: Job) -> dict[str, Any] | None:
    """The Kubernetes object a job was created as, or None for a Gantry submission."""
    workload = (job.spec or {}).get("workload")
    if not isinstance(workload, dict):
        return None
    out = {
        "kind": workload.get("kind", ""),
        "api_version": workload.get("apiVersion", ""),
        "namespace": workload.get("namespace", ""),
        "name": workload.get("name", ""),
        "uid": workload.get("uid", ""),
    }
    if workload.get("pods"):
        out["pods"] = list(workload["pods"])
    return out


class JobOut(serializers.ModelSerializer):
    project_slug = serializers.CharField(source="project.slug", read_only=True)
    tenant_slug = serializers.CharField(source="tenant.slug", read_only=True)
    priority_class = serializers.CharField(source="priority_class.name", read_only=True)
    submitted_by = serializers.CharField(source="submitted_by.username", read_only=True)
    gpus_total = serializers.SerializerMethodField()
    reason = serializers.SerializerMethodField(
        help_text="Why the job waits or stopped; jobs of other teams are not named."
    )
    origin = serializers.SerializerMethodField(
        help_text=(
            "Where the job was created: null for Gantry's portal, API or CLI; for a workload "
            "created in Kubernetes (kubectl, an SDK), its kind and object."
        )
    )

    class Meta:
        model = Job
        fields = [
            "id",
            "name",
            "job_type",
            "state",
            "reason",
            "project",
            "project_slug",
            "tenant",
            "tenant_slug",
            "submitted_by",
            "priority_class",
            "replicas",
            "gpus_per_replica",
            "gpu_milli_per_replica",
            "gpus_total",
            "attempt",
            "created_at",
            "queued_at",
            "started_at",
            "finished_at",
            "spec",
            "origin",
        ]

    @extend_schema_field(OriginOut(allow_null=True))
    def get_origin(self, job: Job) -> dict[str, Any] | None:
        return origin_of(job)

    def get_gpus_total(self, job: Job) -> float:
        return job.replicas * job.gpu_milli_per_replica / 1000

    def get_reason(self, job: Job) -> str:
        return _reader(self, lambda jobs: ReasonReader.texts_of(jobs)).text(job.reason)


class JobSubmitIn(StrictInputSerializer):
    """The envelope: which project, and the spec (see the JobSpec schema)."""

    project = serializers.IntegerField(help_text="Id of a project you are a member of.")
    idempotency_key = serializers.CharField(
        required=False,
        max_length=128,
        help_text="Or the Idempotency-Key header: a repeat returns the first job.",
    )
    spec = serializers.DictField(help_text="The job spec; see the JobSpec fields.")


class JobCancelIn(StrictInputSerializer):
    reason = serializers.CharField(required=False, allow_blank=True, max_length=500, default="")


class JobEventOut(serializers.ModelSerializer):
    actor = serializers.CharField(
        source="actor.username", default=None, read_only=True, allow_null=True
    )
    message = serializers.SerializerMethodField()
    # DRF moves declared fields off the class, so this does not shadow Serializer.data.
    data = serializers.SerializerMethodField()  # type: ignore[assignment]

    class Meta:
        model = JobEvent
        fields = ["id", "at", "kind", "from_state", "to_state", "message", "actor", "data"]

    def get_message(self, event: JobEvent) -> str:
        return self._events_reader().text(event.message)

    def get_data(self, event: JobEvent) -> dict[str, Any]:
        return self._events_reader().data(event.data or {})

    def _events_reader(self) -> ReasonReader:
        return _reader(self, lambda events: ReasonReader.texts_of((), events))
