"""Budgets API: `/api/v1/budgets/`. Everyone reads the budgets of the tenants they see;
finance, platform admins and the tenant's admins (or an ancestor's) write them. A budget of
a tenant the user cannot see is a 404; naming such a tenant in a body is a 400 ('does not
exist'), as for quotas; one they see but may not manage is a 403."""

from __future__ import annotations

from datetime import UTC, date, datetime
from typing import Any

import django_filters
from django.db.models import QuerySet
from drf_spectacular.utils import extend_schema
from rest_framework import mixins, status, viewsets
from rest_framework.request import Request
from rest_framework.response import Response

from billing.api import budget_serializers as s
from billing.budgets.services import budget_create, budget_delete, budget_update
from billing.budgets.spend import BudgetPosition, position_of, positions_of
from billing.models import Budget, BudgetUnit
from common.api.filters import StrictFilterSet
from tenants import access


class BudgetFilter(StrictFilterSet):
    month = django_filters.DateFilter(method="filter_month", help_text="The month's first day.")

    class Meta:
        model = Budget
        fields = ["tenant", "month", "unit", "policy"]

    def filter_month(self, queryset: QuerySet[Budget], name: str, value: date) -> Any:
        return queryset.filter(month=datetime(value.year, value.month, value.day, tzinfo=UTC))


def budget_out(budget: Budget, position: BudgetPosition) -> dict[str, Any]:
    figures = position.as_json()
    return {
        "id": budget.pk,
        "tenant": budget.tenant_id,
        "tenant_slug": budget.tenant.slug,
        "month": f"{budget.month.astimezone(UTC):%Y-%m-%d}",
        "unit": budget.unit,
        "currency": position.currency if budget.unit == BudgetUnit.MONEY else None,
        "limit": f"{budget.limit:f}",
        "policy": budget.policy,
        "position": {k: figures[k] for k in ("spent", "committed", "remaining", "percent")},
        "set_at": budget.set_at_id,
        "set_by": budget.created_by.get_username() if budget.created_by else None,
        "created_at": budget.created_at,
        "updated_at": budget.updated_at,
    }


class BudgetViewSet(
    mixins.ListModelMixin, mixins.RetrieveModelMixin, viewsets.GenericViewSet[Budget]
):
    serializer_class = s.BudgetItemOut
    filterset_class = BudgetFilter

    def get_queryset(self) -> QuerySet[Budget]:
        budgets = Budget.objects.select_related("tenant", "created_by").order_by(
            "-month", "tenant__path"
        )
        return access.visible_by_tenant(self.request.user, budgets)

    def list(self, request: Request) -> Response:
        page = self.paginate_queryset(self.filter_queryset(self.get_queryset())) or []
        positions = positions_of(list(page))
        return self.get_paginated_response([budget_out(b, positions[b.pk]) for b in page])

    def retrieve(self, request: Request, pk: str) -> Response:
        budget = self.get_object()
        return Response(budget_out(budget, position_of(budget)))

    @extend_schema(request=s.BudgetCreateIn, responses={201: s.BudgetItemOut})
    def create(self, request: Request) -> Response:
        body = s.BudgetCreateIn(data=request.data, context={"request": request})
        body.is_valid(raise_exception=True)
        budget = budget_create(user=request.user, **body.validated_data)
        return Response(budget_out(budget, position_of(budget)), status=status.HTTP_201_CREATED)

    @extend_schema(request=s.BudgetUpdateIn, responses=s.BudgetItemOut)
    def partial_update(self, request: Request, pk: str) -> Response:
        budget = self.get_object()
        body = s.BudgetUpdateIn(data=request.data, context={"request": request})
        body.is_valid(raise_exception=True)
        budget = budget_update(user=request.user, budget=budget, **body.validated_data)
        return Response(budget_out(budget, position_of(budget)))

    def destroy(self, request: Request, pk: str) -> Response:
        budget_delete(user=request.user, budget=self.get_object())
        return Response(status=status.HTTP_204_NO_CONTENT)
