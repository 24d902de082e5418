"""The what-if API: propose and replay, follow the progress, read the results."""

from __future__ import annotations

from typing import Any

from django.utils import timezone
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import mixins, status, viewsets
from rest_framework.exceptions import ValidationError
from rest_framework.request import Request
from rest_framework.response import Response

from common.api.filters import StrictFilterSet
from tenants.selectors import approval_list_visible
from whatif import runs
from whatif.api import serializers as s
from whatif.models import WhatIf

ID = OpenApiParameter("id", OpenApiTypes.INT, OpenApiParameter.PATH)


class WhatIfFilter(StrictFilterSet):
    """Filters over the runs the user may already see (`approval`: a quota request's id)."""

    class Meta:
        model = WhatIf
        fields = ["state", "scope", "approval"]


class WhatIfViewSet(mixins.ListModelMixin, mixins.RetrieveModelMixin, viewsets.GenericViewSet[Any]):
    """What-if replays of the last days' jobs under proposed quotas, weights and priorities.
    Platform and tenant admins start them, finance reads them, anyone else gets a 404; a run
    of another scope is a 404."""

    serializer_class = s.WhatIfOut
    filterset_class = WhatIfFilter

    def get_queryset(self) -> Any:
        if getattr(self, "swagger_fake_view", False):  # the schema's generator asks too
            return WhatIf.objects.none()
        runs.require_whatif_user(self.request.user)
        return runs.whatif_list_visible(self.request.user)

    def get_object(self) -> Any:
        runs.require_whatif_user(self.request.user)
        return runs.access_whatif(self.request.user, self.kwargs["pk"])

    @extend_schema(request=s.WhatIfIn, responses={201: s.WhatIfOut})
    def create(self, request: Request) -> Response:
        """Start a replay of `changes` (or of a quota request's change); a Celery task runs it."""
        runs.require_whatif_starter(request.user)
        body = s.WhatIfIn(data=request.data)
        body.is_valid(raise_exception=True)
        data = body.validated_data
        if "approval_request" in data:
            approval = (
                approval_list_visible(request.user).filter(pk=data["approval_request"]).first()
            )
            if approval is None or not runs.may_replay_approval(request.user, approval):
                raise ValidationError(
                    {"approval_request": ["unknown quota request, or not one you decide."]}
                )
            run = runs.whatif_for_approval(
                user=request.user,
                request=approval,
                window_days=data["window_days"],
                now=timezone.now(),
            )
        else:
            run = runs.whatif_start(
                user=request.user,
                scope_id=data.get("scope"),
                window_days=data["window_days"],
                changes=data["changes"],
                now=timezone.now(),
            )
        out = s.WhatIfOut(run, context={"request": request, "detail": True})
        return Response(out.data, status=status.HTTP_201_CREATED)

    @extend_schema(parameters=[ID], responses=s.WhatIfOut)
    def retrieve(self, request: Request, pk: str) -> Response:
        run = self.get_object()
        return Response(s.WhatIfOut(run, context={"request": request, "detail": True}).data)
