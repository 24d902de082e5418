"""Approval requests: the visible list, the inbox, approve and reject.

Every kind of request is decided by `tenants.approvals.approval_decide`, which settles its
subject through the handler registered for its kind (a job's moves the job).
"""

from __future__ import annotations

from typing import Any

from drf_spectacular.utils import extend_schema
from rest_framework import mixins, viewsets
from rest_framework.decorators import action
from rest_framework.request import Request
from rest_framework.response import Response

from common.api.serializers import refuse_any_body
from tenants import selectors
from tenants.api.governance_serializers import ApprovalDecisionIn, ApprovalRequestOut
from tenants.approvals import approval_decide, approval_withdraw
from tenants.models import ApprovalRequest


class ApprovalRequestViewSet(
    mixins.ListModelMixin, mixins.RetrieveModelMixin, viewsets.GenericViewSet
):
    """Requests of the user's subtrees; `inbox` lists those the user may decide."""

    serializer_class = ApprovalRequestOut
    filterset_fields = ["kind", "state", "tenant", "subject_id"]

    def get_queryset(self) -> Any:
        return selectors.approval_list_visible(self.request.user)

    @extend_schema(responses=ApprovalRequestOut(many=True))
    @action(detail=False, methods=["get"])
    def inbox(self, request: Request) -> Response:
        rows = self.filter_queryset(selectors.approval_list_inbox(request.user))
        page = self.paginate_queryset(rows)
        return self.get_paginated_response(ApprovalRequestOut(page, many=True).data)

    @extend_schema(request=ApprovalDecisionIn, responses=ApprovalRequestOut)
    @action(detail=True, methods=["post"])
    def approve(self, request: Request, pk: str) -> Response:
        return self._decide(request, approve=True)

    @extend_schema(request=ApprovalDecisionIn, responses=ApprovalRequestOut)
    @action(detail=True, methods=["post"])
    def reject(self, request: Request, pk: str) -> Response:
        return self._decide(request, approve=False)

    @extend_schema(request=None, responses=ApprovalRequestOut)
    @action(detail=True, methods=["post"])
    def withdraw(self, request: Request, pk: str) -> Response:
        """The requester (or an admin) withdraws a pending quota request; a job's request is
        withdrawn by cancelling the job."""
        approval = self.get_object()
        refuse_any_body(request.data)
        approval = approval_withdraw(user=request.user, request=approval)
        return Response(ApprovalRequestOut(approval).data)

    def _decide(self, request: Request, *, approve: bool) -> Response:
        approval: ApprovalRequest = self.get_object()
        body = ApprovalDecisionIn(data=request.data, context={"request": request})
        body.is_valid(raise_exception=True)
        approval = approval_decide(
            user=request.user,
            request=approval,
            approve=approve,
            comment=body.validated_data["comment"],
        )
        return Response(ApprovalRequestOut(approval).data)
