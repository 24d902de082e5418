"""Cost API (read-only), statements (read; close and adjust by finance and platform admins),
and the per-organisation idle capacity policy (read by finance, set by platform admins)."""

from __future__ import annotations

from decimal import Decimal, InvalidOperation
from typing import Any

import django_filters
from django.conf import settings
from django.http import Http404
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import generics, mixins, status, viewsets
from rest_framework.decorators import action
from rest_framework.exceptions import ValidationError
from rest_framework.request import Request
from rest_framework.response import Response

from billing import selectors
from billing.api import cost_serializers as s
from billing.metering import late as late_usage
from billing.periods import month_bounds
from billing.policies import billing_policy_set
from billing.statements.closing import statement_adjust, statement_close
from billing.statements.rollup import roll_up
from common.api.filters import IntegerFilter, StrictFilterSet
from common.api.pagination import MAX_PAGE_SIZE
from tenants import access
from tenants.models import Project, Tenant

PAGE_PARAMETERS = [
    OpenApiParameter("page", {"type": "integer", "minimum": 1}, description="Page number."),
    OpenApiParameter(
        "page_size",
        {"type": "integer", "minimum": 1, "maximum": MAX_PAGE_SIZE},
        description=f"Rows per page, 1 to {MAX_PAGE_SIZE}.",
    ),
]


class CostListView(generics.GenericAPIView):
    """Costs of a window aggregated by one dimension, from the metered usage: the same
    figures as the statements of that window, to the cent. Each user sees the costs they may
    (billing.selectors); filters outside them give an empty page."""

    serializer_class = s.CostRowOut
    filter_backends: list[Any] = []

    @extend_schema(parameters=[s.CostQueryIn, *PAGE_PARAMETERS], responses=s.CostPageOut)
    def get(self, request: Request) -> Response:
        query = s.CostQueryIn(data=request.query_params.dict())
        query.is_valid(raise_exception=True)
        data = query.validated_data
        lines = selectors.cost_lines_visible(
            request.user, data["from"], data["to"], selectors.line_filter_for(data)
        )
        rows = selectors.aggregate(lines, data["by"])
        page = self.paginate_queryset(rows)  # type: ignore[arg-type]
        response = self.get_paginated_response(s.CostRowOut(page, many=True).data)
        total = selectors.totals(lines)
        response.data.update(
            currency=settings.GANTRY_BILLING_CURRENCY,
            by=data["by"],
            window={
                "from": s.HourField().to_representation(data["from"]),
                "to": s.HourField().to_representation(data["to"]),
            },
            total={
                "charged": str(total.charged),
                "showback": str(total.showback),
                **s.hour_figures(total),
            },
        )
        return response


class StatementFilter(StrictFilterSet):
    organisation = IntegerFilter(field_name="organisation")
    period_after = django_filters.IsoDateTimeFilter(field_name="period_start", lookup_expr="gte")
    period_before = django_filters.IsoDateTimeFilter(field_name="period_start", lookup_expr="lt")

    class Meta:
        model = selectors.Statement
        fields = ["organisation"]


class StatementViewSet(
    mixins.ListModelMixin, mixins.RetrieveModelMixin, viewsets.GenericViewSet[Any]
):
    """Closed statements of the organisations the user holds a role in (all of them for
    finance and platform admins); their lines and roll-up as far as the user may see."""

    serializer_class = s.StatementOut
    filterset_class = StatementFilter

    def get_queryset(self) -> Any:
        return selectors.statement_list_visible(self.request.user)

    def get_object(self) -> Any:
        return selectors.access_statement(self.request.user, self.kwargs["pk"])

    @extend_schema(responses=s.StatementDetailOut)
    def retrieve(self, request: Request, pk: str) -> Response:
        statement = self.get_object()
        totals = roll_up(statement.lines.values_list("tenant_id", "amount", "charged"))
        tenants = selectors.rolled_up_tenants(request.user, statement.organisation)
        data = dict(s.StatementOut(statement).data)
        data["roll_up"] = [
            {
                "tenant": t.pk,
                "tenant_slug": t.slug,
                "parent_id": t.parent_id,
                "charged": str(totals[t.pk].charged if t.pk in totals else Decimal("0.00")),
                "showback": str(totals[t.pk].showback if t.pk in totals else Decimal("0.00")),
            }
            for t in tenants
        ]
        return Response(data)

    @extend_schema(parameters=PAGE_PARAMETERS, responses=s.StatementLineOut(many=True))
    @action(detail=True, methods=["get"], filter_backends=[])
    def lines(self, request: Request, pk: str) -> Response:
        statement = self.get_object()
        rows = selectors.statement_lines_visible(request.user, statement)
        page = self.paginate_queryset(rows)  # type: ignore[arg-type]
        return self.get_paginated_response(s.StatementLineOut(page, many=True).data)

    @extend_schema(request=s.StatementCloseIn, responses={201: s.StatementOut})
    @action(detail=False, methods=["post"], filter_backends=[])
    def close(self, request: Request) -> Response:
        """Close an organisation's month (idempotent: a closed one is returned as it is)."""
        access.require_books_keeper(request.user)
        body = s.StatementCloseIn(data=request.data)
        body.is_valid(raise_exception=True)
        organisation = access.access_tenant(request.user, body.validated_data["organisation"])
        start, end = month_bounds(body.validated_data["month"])
        statement = statement_close(
            user=request.user, organisation=organisation, start=start, end=end
        )
        return Response(s.StatementOut(statement).data, status=status.HTTP_201_CREATED)

    @extend_schema(request=s.StatementAdjustIn, responses={201: s.StatementLineOut})
    @action(detail=True, methods=["post"], filter_backends=[])
    def adjust(self, request: Request, pk: str) -> Response:
        """Append an adjustment line (a correction with a reason) to a closed statement."""
        statement = self.get_object()
        access.require_books_keeper(request.user)
        body = s.StatementAdjustIn(data=request.data)
        body.is_valid(raise_exception=True)
        data = body.validated_data
        tenant = Tenant.objects.filter(pk=data["tenant"]).first()
        project = None
        if data.get("project") is not None:
            project = Project.objects.filter(pk=data["project"]).first()
            if project is None:
                raise ValidationError({"project": ["no such project."]})
        if tenant is None:
            raise ValidationError({"tenant": ["no such tenant."]})
        try:
            amount = Decimal(data["amount"])
        except InvalidOperation:  # pragma: no cover - the pattern admits decimals only
            raise ValidationError({"amount": ["not a decimal."]}) from None
        line = statement_adjust(
            user=request.user,
            statement=statement,
            tenant=tenant,
            project=project,
            amount=amount,
            reason=data["reason"],
        )
        return Response(s.StatementLineOut(line).data, status=status.HTTP_201_CREATED)

    @extend_schema(parameters=PAGE_PARAMETERS, responses=s.AdjustmentProposalOut(many=True))
    @action(detail=True, methods=["get"], filter_backends=[])
    def proposals(self, request: Request, pk: str) -> Response:
        """The pending adjustments metering proposes for usage recorded after the close
        (billing/metering/late.py). Finance and platform admins."""
        statement = self.get_object()
        rows = late_usage.proposals_pending(request.user).filter(statement=statement)
        page = self.paginate_queryset(rows.order_by("id"))  # type: ignore[arg-type]
        return self.get_paginated_response(s.AdjustmentProposalOut(page, many=True).data)

    @extend_schema(request=s.ProposalAcceptIn, responses={201: s.StatementLineOut})
    @action(
        detail=True,
        methods=["post"],
        filter_backends=[],
        url_path="accept-proposal",
        url_name="accept",
    )
    def accept_proposal(self, request: Request, pk: str) -> Response:
        """Accept a pending proposal: its adjustment line is appended to the statement by the
        adjustment service (as `adjust`, with the proposal's amount and reason)."""
        statement = self.get_object()
        access.require_books_keeper(request.user)
        body = s.ProposalAcceptIn(data=request.data)
        body.is_valid(raise_exception=True)
        proposal = statement.proposals.filter(pk=body.validated_data["proposal"]).first()
        if proposal is None:
            raise ValidationError({"proposal": ["no such proposal on this statement."]})
        accepted = late_usage.proposal_accept(user=request.user, proposal=proposal)
        return Response(s.StatementLineOut(accepted.line).data, status=status.HTTP_201_CREATED)


class BillingPolicyViewSet(viewsets.GenericViewSet[Any]):
    """Where each organisation's idle reserved capacity goes. Finance and platform admins read
    it (others get an empty list, and a 404 for one); platform admins set it. The id is the
    organisation's."""

    serializer_class = s.BillingPolicyOut
    filter_backends: list[Any] = []

    @staticmethod
    def _out(organisation: Tenant, policy: str) -> dict[str, Any]:
        return {
            "organisation": organisation.pk,
            "organisation_slug": organisation.slug,
            "idle_policy": policy,
        }

    @extend_schema(responses=s.BillingPolicyOut(many=True))
    def list(self, request: Request) -> Response:
        rows = [self._out(o, p) for o, p in selectors.billing_policies_visible(request.user)]
        page = self.paginate_queryset(rows)  # type: ignore[arg-type]
        return self.get_paginated_response(page)

    def _find(self, request: Request, pk: str) -> tuple[Tenant, str]:
        for organisation, policy in selectors.billing_policies_visible(request.user):
            if str(organisation.pk) == str(pk):
                return organisation, policy
        raise Http404("Not found.")

    @extend_schema(
        parameters=[OpenApiParameter("id", OpenApiTypes.INT, OpenApiParameter.PATH)],
        responses=s.BillingPolicyOut,
    )
    def retrieve(self, request: Request, pk: str) -> Response:
        return Response(self._out(*self._find(request, pk)))

    @extend_schema(
        parameters=[OpenApiParameter("id", OpenApiTypes.INT, OpenApiParameter.PATH)],
        request=s.BillingPolicyIn,
        responses=s.BillingPolicyOut,
    )
    def update(self, request: Request, pk: str) -> Response:
        organisation, _ = self._find(request, pk)
        access.require_platform_admin(request.user)
        body = s.BillingPolicyIn(data=request.data)
        body.is_valid(raise_exception=True)
        policy = billing_policy_set(
            user=request.user,
            organisation=organisation,
            idle_policy=body.validated_data["idle_policy"],
        )
        return Response(self._out(organisation, policy.idle_policy))
