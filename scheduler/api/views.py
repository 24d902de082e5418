"""Job API: list with filters, submit, get, cancel, events."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import django_filters
from django.db.models import Q, QuerySet
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import mixins, status, viewsets
from rest_framework.decorators import action
from rest_framework.exceptions import ValidationError
from rest_framework.request import Request
from rest_framework.response import Response

from common.api.filters import StrictFilterSet
from common.api.throttles import SubmitThrottle
from scheduler.api.serializers import JobCancelIn, JobEventOut, JobOut, JobSubmitIn
from scheduler.jobs import selectors, services
from scheduler.models import Job, JobState
from tenants import access
from tenants.models import JobType, Project


class JobFilter(StrictFilterSet):
    # Columns of the job itself: no join can repeat a row, so no DISTINCT (django-filter's
    # default for this filter), which made PostgreSQL sort every matching job on all its
    # columns, the spec included, before it could take a page.
    state = django_filters.MultipleChoiceFilter(choices=JobState.choices, distinct=False)
    job_type = django_filters.MultipleChoiceFilter(choices=JobType.choices, distinct=False)
    priority_class = django_filters.CharFilter(field_name="priority_class__name")
    submitted_by = django_filters.CharFilter(field_name="submitted_by__username")
    created_after = django_filters.IsoDateTimeFilter(field_name="created_at", lookup_expr="gte")
    created_before = django_filters.IsoDateTimeFilter(field_name="created_at", lookup_expr="lt")
    name = django_filters.CharFilter(field_name="name", lookup_expr="icontains", max_length=63)
    origin = django_filters.ChoiceFilter(
        choices=[("gantry", "gantry"), ("kubernetes", "kubernetes")],
        method="filter_origin",
        help_text="gantry: submitted through the portal, API or CLI; kubernetes: created "
        "in Kubernetes (kubectl, an SDK) and queued by Gantry.",
    )

    class Meta:
        model = Job
        fields = ["project", "tenant", "state", "job_type", "priority_class", "submitted_by"]

    def filter_origin(self, queryset: QuerySet[Job], name: str, value: str) -> QuerySet[Job]:
        in_kubernetes = Q(spec__has_key="workload")  # only the workload controller sets it
        return queryset.filter(in_kubernetes if value == "kubernetes" else ~in_kubernetes)


def submit_envelope(request: Request) -> tuple[Project, dict[str, Any]]:
    """The project (a 404 when the user cannot see it) and the validated envelope of a
    submit body. The quote endpoint (billing) reads the same body through this."""
    envelope = JobSubmitIn(data=request.data)
    envelope.is_valid(raise_exception=True)
    unknown = sorted(set(request.data) - set(envelope.fields))
    if unknown:
        raise ValidationError({key[:64]: ["unknown field."] for key in unknown[:20]})
    data = dict(envelope.validated_data)
    return access.access_project(request.user, data["project"]), data


@contextmanager
def spec_errors_under_spec() -> Iterator[None]:
    """Spec errors are reported under "spec", like the body the client sent."""
    try:
        yield
    except ValidationError as exc:
        if isinstance(exc.detail, dict) and "idempotency_key" in exc.detail:
            raise
        raise ValidationError({"spec": exc.detail}) from exc


class JobViewSet(mixins.ListModelMixin, mixins.RetrieveModelMixin, viewsets.GenericViewSet):
    serializer_class = JobOut
    filterset_class = JobFilter

    def get_queryset(self) -> Any:
        return selectors.job_list_visible(self.request.user)

    def get_throttles(self) -> list[Any]:
        # Submissions write the most (a job, its events, approvals, audit): a scope of their own.
        extra = [SubmitThrottle()] if self.action == "create" else []
        return [*super().get_throttles(), *extra]

    @extend_schema(
        request=JobSubmitIn,
        responses={201: JobOut, 200: JobOut},
        parameters=[OpenApiParameter("Idempotency-Key", str, OpenApiParameter.HEADER)],
    )
    def create(self, request: Request) -> Response:
        project, data = submit_envelope(request)
        key = request.headers.get("Idempotency-Key") or data.get("idempotency_key")
        with spec_errors_under_spec():
            job, created = services.job_submit(
                user=request.user, project=project, payload=data["spec"], idempotency_key=key
            )
        code = status.HTTP_201_CREATED if created else status.HTTP_200_OK
        return Response(JobOut(job, context=self.get_serializer_context()).data, status=code)

    @extend_schema(request=JobCancelIn, responses=JobOut)
    @action(detail=True, methods=["post"])
    def cancel(self, request: Request, pk: str) -> Response:
        job = self.get_object()
        body = JobCancelIn(data=request.data)
        body.is_valid(raise_exception=True)
        job = services.job_cancel(user=request.user, job=job, reason=body.validated_data["reason"])
        return Response(JobOut(job, context=self.get_serializer_context()).data)

    @extend_schema(responses=JobEventOut(many=True))
    @action(detail=True, methods=["get"], filterset_class=None)
    def events(self, request: Request, pk: str) -> Response:
        job = self.get_object()
        page = self.paginate_queryset(selectors.job_event_list(job))
        events = JobEventOut(page, many=True, context=self.get_serializer_context())
        return self.get_paginated_response(events.data)
