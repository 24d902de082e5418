"""Billing API: rate cards (read by everyone signed in, added by finance and platform admins,
withdrawn by platform admins)."""

from __future__ import annotations

from drf_spectacular.utils import extend_schema
from rest_framework import mixins, status, viewsets
from rest_framework.request import Request
from rest_framework.response import Response

from billing.api import serializers as s
from billing.models import RateCard
from billing.rates import cards as rates
from tenants import access


class RateCardViewSet(
    mixins.ListModelMixin, mixins.RetrieveModelMixin, viewsets.GenericViewSet[RateCard]
):
    """Prices are platform-wide, like flavors: every user may read them (a team sees what
    a job will cost before it runs); finance and platform admins add versions (the service
    checks), platform admins withdraw them."""

    serializer_class = s.RateCardOut
    filterset_fields = ["flavor", "cluster"]
    queryset = RateCard.objects.select_related("flavor", "cluster").prefetch_related(
        "multipliers__priority_class"
    )

    @extend_schema(request=s.RateCardIn, responses={201: s.RateCardOut})
    def create(self, request: Request) -> Response:
        access.require_books_keeper(request.user)  # before validation: no oracle for others
        serializer = s.RateCardIn(data=request.data, context={"request": request})
        serializer.is_valid(raise_exception=True)
        card = serializer.add(request.user)
        card = self.get_queryset().get(pk=card.pk)
        return Response(s.RateCardOut(card).data, status=status.HTTP_201_CREATED)

    def destroy(self, request: Request, pk: str) -> Response:
        access.require_platform_admin(request.user)
        rates.rate_card_withdraw(user=request.user, rate_card=self.get_object())
        return Response(status=status.HTTP_204_NO_CONTENT)
