"""Governance API: approval policies, quota requests, the audit log and its CSV export.

Approval requests (list, inbox, approve, reject) live in `scheduler.api.approvals`, which
decides them through `tenants.approvals.approval_decide`. The audit log has no write route.
"""

from __future__ import annotations

import csv
import io
import json
from typing import Any

import django_filters
from django.http import HttpResponse
from django.utils import timezone
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema
from rest_framework import mixins, status, viewsets
from rest_framework.exceptions import ValidationError
from rest_framework.renderers import BaseRenderer, JSONRenderer
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from common.api.filters import IntegerFilter, StrictFilterSet
from common.text import csv_safe
from tenants import approvals, selectors
from tenants.api import governance_serializers as g
from tenants.api.views import ReadWriteViewSet
from tenants.approval_policies import policy_delete, policy_set
from tenants.models import ApprovalPolicy, AuditEntry, Tenant

# An export larger than this is refused: narrow it with the filters.
AUDIT_EXPORT_MAX_ROWS = 100_000


class ApprovalPolicyViewSet(ReadWriteViewSet):
    """Approval policies of the user's subtrees; admins of the subtree create and change them."""

    output_serializer = g.ApprovalPolicyOut
    filterset_fields = ["tenant", "rule", "active", "applies_to_jobs", "applies_to_quota"]

    def get_queryset(self) -> Any:
        return selectors.policy_list_visible(self.request.user)

    @extend_schema(request=g.ApprovalPolicyCreateIn, responses={201: g.ApprovalPolicyOut})
    def create(self, request: Request) -> Response:
        data = self.read_input(g.ApprovalPolicyCreateIn)
        policy = policy_set(user=request.user, **data)
        return self.respond(policy, status.HTTP_201_CREATED)

    @extend_schema(request=g.ApprovalPolicyUpdateIn, responses=g.ApprovalPolicyOut)
    def partial_update(self, request: Request, pk: str) -> Response:
        policy: ApprovalPolicy = self.get_object()
        current = {
            "rule": policy.rule,
            "threshold": None if policy.threshold is None else float(policy.threshold),
            "priority_class": policy.priority_class.name if policy.priority_class else None,
            "applies_to_jobs": policy.applies_to_jobs,
            "applies_to_quota": policy.applies_to_quota,
            "active": policy.active,
            "description": policy.description,
        }
        if not isinstance(request.data, dict):
            raise ValidationError({"non_field_errors": ["expected a JSON object."]})
        serializer = g.ApprovalPolicyUpdateIn(
            data={**current, **request.data}, context={"request": request}
        )
        serializer.is_valid(raise_exception=True)
        policy = policy_set(
            user=request.user, tenant=policy.tenant, policy=policy, **serializer.validated_data
        )
        return self.respond(policy)

    def destroy(self, request: Request, pk: str) -> Response:
        policy_delete(user=request.user, policy=self.get_object())
        return Response(status=status.HTTP_204_NO_CONTENT)


class QuotaRequestViewSet(viewsets.GenericViewSet):
    """A tenant admin asks the admins above for a quota change (see approval-requests)."""

    serializer_class = g.ApprovalRequestOut

    def get_queryset(self) -> Any:
        return selectors.approval_list_visible(self.request.user)

    @extend_schema(request=g.QuotaRequestIn, responses={201: g.ApprovalRequestOut})
    def create(self, request: Request) -> Response:
        body = g.QuotaRequestIn(data=request.data, context={"request": request})
        body.is_valid(raise_exception=True)
        data = dict(body.validated_data)
        tenant, flavor = data.pop("tenant"), data.pop("flavor")
        justification, cluster = data.pop("justification"), data.pop("cluster")
        approval = approvals.quota_request_create(
            user=request.user,
            tenant=tenant,
            flavor=flavor,
            values=data,  # only the fields named
            justification=justification,
            cluster=cluster,
        )
        return Response(g.ApprovalRequestOut(approval).data, status=status.HTTP_201_CREATED)


class AuditFilter(StrictFilterSet):
    actor = django_filters.CharFilter(field_name="actor_name", max_length=150)
    action = django_filters.CharFilter(field_name="action", max_length=64)
    tenant = IntegerFilter(method="filter_subtree", label="Entries of this tenant and its subtree.")
    target_type = django_filters.CharFilter(field_name="target_type", max_length=64)
    target_id = django_filters.CharFilter(field_name="target_id", max_length=64)
    at_after = django_filters.IsoDateTimeFilter(field_name="at", lookup_expr="gte")
    at_before = django_filters.IsoDateTimeFilter(field_name="at", lookup_expr="lt")

    class Meta:
        model = AuditEntry
        fields = ["actor", "action", "tenant", "target_type", "target_id"]

    def filter_subtree(self, queryset: Any, name: str, value: int) -> Any:
        path = Tenant.objects.filter(pk=int(value)).values_list("path", flat=True).first()
        if path is None:
            return queryset.none()
        return queryset.filter(tenant__path__startswith=path)


class AuditEntryViewSet(mixins.ListModelMixin, mixins.RetrieveModelMixin, viewsets.GenericViewSet):
    """The audit log of the user's subtrees (admins), or all of it (platform admins, finance).

    Read-only: entries are written by the services that make the changes, never through here.
    """

    serializer_class = g.AuditEntryOut
    filterset_class = AuditFilter

    def get_queryset(self) -> Any:
        return selectors.audit_list_visible(self.request.user)


class CSVRenderer(BaseRenderer):
    """Lets a client ask for text/csv (`?format=csv`, `Accept: text/csv`); the rows are
    written by the view, and errors are answered as JSON (AuditExportView.finalize_response)."""

    media_type = "text/csv"
    format = "csv"
    charset = "utf-8"

    def render(
        self, data: Any, accepted_media_type: Any = None, renderer_context: Any = None
    ) -> Any:
        return data if isinstance(data, (str, bytes)) else json.dumps(data)


class AuditExportView(APIView):
    """The filtered audit log as CSV; every cell is neutralised against formula injection."""

    renderer_classes = [JSONRenderer, CSVRenderer]

    def finalize_response(
        self, request: Request, response: Response, *args: Any, **kwargs: Any
    ) -> Response:
        # An error is the API's JSON error shape, whatever format the rows were asked in:
        # the schema declares it so, and a client reads it the same way on every route.
        if isinstance(response, Response) and response.status_code >= 400:
            request.accepted_renderer = JSONRenderer()
            request.accepted_media_type = JSONRenderer.media_type
        return super().finalize_response(request, response, *args, **kwargs)

    @extend_schema(
        parameters=[
            OpenApiParameter("actor", str, description="Username of who acted."),
            OpenApiParameter("action", str, description="e.g. quota.set, approval.decide."),
            OpenApiParameter("tenant", int, description="Entries of this tenant's subtree."),
            OpenApiParameter("target_type", str),
            OpenApiParameter("target_id", str),
            OpenApiParameter("at_after", OpenApiTypes.DATETIME, description="From (inclusive)."),
            OpenApiParameter("at_before", OpenApiTypes.DATETIME, description="Until (exclusive)."),
        ],
        responses={(200, "text/csv"): OpenApiResponse(OpenApiTypes.STR)},
    )
    def get(self, request: Request) -> HttpResponse:
        rows = AuditFilter(
            request.query_params, queryset=selectors.audit_list_visible(request.user)
        )
        if not rows.is_valid():
            raise ValidationError(rows.errors)
        entries = rows.qs.order_by("at", "id")
        if entries.count() > AUDIT_EXPORT_MAX_ROWS:
            raise ValidationError(
                {
                    "non_field_errors": [
                        f"more than {AUDIT_EXPORT_MAX_ROWS} entries; narrow the "
                        "filters (at_after, at_before, tenant, action)."
                    ]
                }
            )
        buffer = io.StringIO()
        writer = csv.writer(buffer)
        writer.writerow(g.AUDIT_CSV_HEADER)
        for entry in entries.iterator(chunk_size=2000):
            writer.writerow([csv_safe(cell) for cell in g.audit_csv_row(entry)])
        stamp = timezone.now().strftime("%Y%m%d-%H%M%S")
        response = HttpResponse(buffer.getvalue(), content_type="text/csv; charset=utf-8")
        response["Content-Disposition"] = f'attachment; filename="gantry-audit-{stamp}.csv"'
        return response
