"""The capacity API: forecasts and plans (read), pool targets, TCO inputs, rate suggestions,
and the plans as a file. Thin: access is capacity/access.py's; writes go through
capacity/api/submissions.py, which the page's forms call too (one check of the values)."""

from __future__ import annotations

from typing import Any

from django.http import HttpResponse
from django.utils import timezone
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiResponse, extend_schema
from rest_framework import generics, mixins, status, viewsets
from rest_framework.decorators import action
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from billing.api.costs import PAGE_PARAMETERS
from billing.api.exports import JSONErrors
from capacity import access, export, selectors
from capacity.api import serializers as s
from capacity.api import submissions
from capacity.models import PoolTarget, RateSuggestion, TcoInputs
from capacity.present import PoolPlan, capacity_plans


def _plans(request: Request, query: type[s.PlansQueryIn]) -> tuple[dict[str, Any], list[PoolPlan]]:
    access.require_capacity_viewer(request.user)
    params = query(data=request.query_params.dict())
    params.is_valid(raise_exception=True)
    data = dict(params.validated_data)
    run = selectors.forecast_run_latest()
    if run is None:
        return data, []
    plans = capacity_plans(
        request.user, run=run, flavor=data.get("flavor"), extra_gpus=data.get("gpus")
    )
    return data, plans


class PlanListView(generics.GenericAPIView):  # type: ignore[type-arg]
    """Per pool (platform admins, finance) or per administered subtree (tenant admins): the
    daily history, the forecast band, the saturation days, drivers, expansion options and TCO,
    from the latest forecast run (refreshed by Celery beat). Anyone else: 403."""

    serializer_class = s.PlanOut
    filter_backends: list[Any] = []

    @extend_schema(parameters=[s.PlansQueryIn, *PAGE_PARAMETERS], responses=s.PlanOut(many=True))
    def get(self, request: Request) -> Response:
        _, plans = _plans(request, s.PlansQueryIn)
        run = selectors.forecast_run_latest()
        page = self.paginate_queryset(plans)  # type: ignore[arg-type]
        response = self.get_paginated_response(s.PlanOut(page, many=True).data)
        response.data["run"] = (
            None
            if run is None
            else {
                "id": run.pk,
                "last_day": run.last_day,
                "finished_at": run.finished_at,
                "method": run.method,
                "baseline": run.baseline,
            }
        )
        return response


class PlanExportView(APIView):
    """The plans the viewer sees, as CSV (figures) or XLSX (figures and daily series)."""

    content_negotiation_class = JSONErrors

    @extend_schema(
        parameters=[s.ExportQueryIn],
        responses={
            (200, t): OpenApiResponse(OpenApiTypes.BINARY) for t in export.CONTENT_TYPES.values()
        },
    )
    def get(self, request: Request) -> HttpResponse:
        data, plans = _plans(request, s.ExportQueryIn)
        return export.attachment(plans, data["format"], now=timezone.now())


class PoolTargetViewSet(mixins.ListModelMixin, viewsets.GenericViewSet[PoolTarget]):
    """The utilization each pool is full at: read by platform admins and finance, set (POST,
    one per pool: set again to change) by platform admins."""

    serializer_class = s.PoolTargetOut

    def get_queryset(self) -> Any:
        if not getattr(self, "swagger_fake_view", False):
            access.require_capacity_planner_reader(self.request.user)
        return PoolTarget.objects.select_related("flavor").order_by("flavor__name")

    @extend_schema(request=s.PoolTargetIn, responses={200: s.PoolTargetOut})
    def create(self, request: Request) -> Response:
        target = submissions.pool_target_submit(user=request.user, data=request.data)
        return Response(s.PoolTargetOut(target).data, status=status.HTTP_200_OK)


class TcoInputsViewSet(mixins.ListModelMixin, viewsets.GenericViewSet[TcoInputs]):
    """What owning and renting one GPU of each model costs: finance and platform admins read
    and set them (POST, one per model: set again to change)."""

    serializer_class = s.TcoInputsOut

    def get_queryset(self) -> Any:
        if not getattr(self, "swagger_fake_view", False):
            access.require_capacity_planner_reader(self.request.user)
        return selectors.tco_inputs_list()

    @extend_schema(request=s.TcoInputsIn, responses={200: s.TcoInputsOut})
    def create(self, request: Request) -> Response:
        inputs = submissions.tco_inputs_submit(user=request.user, data=request.data)
        return Response(s.TcoInputsOut(inputs).data, status=status.HTTP_200_OK)


class RateSuggestionViewSet(
    mixins.ListModelMixin, mixins.RetrieveModelMixin, viewsets.GenericViewSet[RateSuggestion]
):
    """GPU-hour prices that recover a model's cost of owning at a target utilization: finance
    and platform admins suggest them, reject them (with a reason), and accept them (a rate card
    through billing, added in the name of whoever accepts). Anyone else: 403 on the list, 404
    on one suggestion."""

    serializer_class = s.RateSuggestionOut
    filterset_fields = ["state", "flavor"]

    def get_queryset(self) -> Any:
        if getattr(self, "swagger_fake_view", False):
            return RateSuggestion.objects.none()
        if self.action == "list":
            access.require_capacity_planner_reader(self.request.user)
        elif not access.sees_pools(self.request.user):
            return RateSuggestion.objects.none()  # invisible: a 404
        return selectors.rate_suggestion_list()

    @extend_schema(request=s.RateSuggestionIn, responses={201: s.RateSuggestionOut})
    def create(self, request: Request) -> Response:
        suggestion = submissions.rate_suggestion_submit(user=request.user, data=request.data)
        return Response(s.RateSuggestionOut(suggestion).data, status=status.HTTP_201_CREATED)

    @extend_schema(request=s.AcceptIn, responses={200: s.RateSuggestionOut})
    @action(detail=True, methods=["post"])
    def accept(self, request: Request, pk: str) -> Response:
        return self._decide(request, accept=True)

    @extend_schema(request=s.RejectIn, responses={200: s.RateSuggestionOut})
    @action(detail=True, methods=["post"])
    def reject(self, request: Request, pk: str) -> Response:
        return self._decide(request, accept=False)

    def _decide(self, request: Request, *, accept: bool) -> Response:
        done = submissions.rate_suggestion_decide_submit(
            user=request.user, suggestion=self.get_object(), accept=accept, data=request.data
        )
        return Response(s.RateSuggestionOut(done).data)


class ExpansionView(APIView):
    """Start a what-if of an expansion (platform admins): GPUs added, removed or moved, the
    window's jobs replayed at the demand the forecast expects; follow it at
    /api/v1/what-ifs/{id}/ (waits per tenant, utilization). Anyone else: 403."""

    @extend_schema(request=s.ExpansionIn, responses={201: s.ExpansionOut})
    def post(self, request: Request) -> Response:
        started = submissions.expansion_submit(
            user=request.user, data=request.data, now=timezone.now()
        )
        out = {
            "whatif": started.run.pk,
            "demand_scale": started.demand_scale,
            "saturation": started.option.saturation,
        }
        return Response(s.ExpansionOut(out).data, status=status.HTTP_201_CREATED)
