"""`/api/v1/usage/`: your tenants against their quotas (`gantry usage`): per tenant and
flavor, the GPUs in use in its subtree, its guarantee and its limit, and the models its
subtree holds without a quota (borrowed). Read-only."""

from __future__ import annotations

from typing import Any

from drf_spectacular.utils import extend_schema
from rest_framework import serializers
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from scheduler.snapshot.quota_usage import quota_rows
from tenants import access
from tenants.models import Membership, Tenant


class UsageOut(serializers.Serializer):
    tenant = serializers.IntegerField(source="tenant.pk")
    tenant_slug = serializers.CharField(source="tenant.slug")
    flavor_name = serializers.CharField(source="flavor.name")
    used_milli = serializers.IntegerField(help_text="milli-GPU held now in the subtree.")
    guaranteed_milli = serializers.IntegerField()
    limit_milli = serializers.IntegerField(
        allow_null=True, help_text="null where the tenant sets no quota on the model (`quota`)."
    )
    borrowing = serializers.BooleanField(help_text="In use beyond the guarantee.")
    quota = serializers.BooleanField(
        help_text="false: the subtree holds GPUs of a model its tenant sets no quota on, "
        "borrowed (no guarantee, no limit of its own: its ancestors' limits apply)."
    )


class UsageQuery(serializers.Serializer):
    tenant = serializers.IntegerField(
        required=False, min_value=1, help_text="A tenant you may see (default: your own)."
    )


def usage_tenants(user: Any, tenant_id: Any = None) -> list[Tenant]:
    """The tenant asked for (404 when the user may not see it), else those the user holds a
    role on directly, tree order."""
    if tenant_id is not None:
        return [access.access_tenant(user, tenant_id)]
    ids = Membership.objects.filter(user=user).values_list("tenant_id", flat=True)
    return list(access.tenants_visible(user).filter(pk__in=ids).order_by("path"))


class UsageView(APIView):
    """Quota and use now, for each flavor of your tenants (or `?tenant=`), in tree order."""

    @extend_schema(parameters=[UsageQuery], responses=UsageOut(many=True))
    def get(self, request: Request) -> Response:
        # A plain dict, as the other query serializers take: a QueryDict is read as an HTML
        # form's, where an empty optional field (`?tenant=`) counts as not sent.
        query = UsageQuery(data=request.query_params.dict())
        query.is_valid(raise_exception=True)
        tenants = usage_tenants(request.user, query.validated_data.get("tenant"))
        return Response(UsageOut(quota_rows(tenants), many=True).data)
