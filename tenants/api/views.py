"""Organisation API: thin views over `tenants.access` (reads) and `tenants.services` (writes)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import django_filters
from django.core.exceptions import PermissionDenied
from drf_spectacular.utils import extend_schema
from rest_framework import mixins, status, viewsets
from rest_framework.decorators import action
from rest_framework.exceptions import ValidationError
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from common.api.filters import StrictFilterSet
from common.api.serializers import refuse_any_body
from tenants import access, idle_rules, outbox, registries, selectors, services
from tenants.api import serializers as s
from tenants.models import (
    Membership,
    PriorityClass,
    PriorityDefault,
    Quota,
    ResourceFlavor,
)
from tenants.quotas.rules import QuotaValues


class ReadWriteViewSet(mixins.ListModelMixin, mixins.RetrieveModelMixin, viewsets.GenericViewSet):
    """List and retrieve through `get_queryset` (already scoped); writes are explicit methods."""

    output_serializer: type[Any]

    def get_serializer_class(self) -> type[Any]:
        return self.output_serializer

    def respond(self, obj: Any, code: int = status.HTTP_200_OK) -> Response:
        return Response(self.output_serializer(obj, context={"request": self.request}).data, code)

    def read_input(self, serializer_class: type[Any], partial: bool = False) -> dict[str, Any]:
        serializer = serializer_class(
            data=self.request.data, partial=partial, context={"request": self.request}
        )
        serializer.is_valid(raise_exception=True)
        return dict(serializer.validated_data)


class TenantViewSet(ReadWriteViewSet):
    output_serializer = s.TenantOut
    filterset_fields = ["parent", "kind", "slug", "depth"]

    def get_queryset(self) -> Any:
        return access.tenants_visible(self.request.user)

    @extend_schema(request=s.TenantCreateIn, responses={201: s.TenantOut})
    def create(self, request: Request) -> Response:
        data = self.read_input(s.TenantCreateIn)
        tenant = services.tenant_create(user=request.user, **data)
        return self.respond(tenant, status.HTTP_201_CREATED)

    @extend_schema(request=s.TenantUpdateIn, responses=s.TenantUpdateOut)
    def partial_update(self, request: Request, pk: str) -> Response:
        tenant = self.get_object()
        data = self.read_input(s.TenantUpdateIn, partial=True)
        tenant = services.tenant_update(user=request.user, tenant=tenant, **data)
        return Response(s.TenantUpdateOut(tenant, context={"request": request}).data)

    @extend_schema(request=None, responses=s.IdleRuleOut, methods=["GET"])
    @extend_schema(request=None, responses={204: None}, methods=["DELETE"])
    @extend_schema(request=s.IdleRuleIn, responses=s.IdleRuleOut, methods=["PUT"])
    @action(
        detail=True, methods=["get", "put", "delete"], url_path="idle-rule", url_name="idlerule"
    )
    def idle_rule(self, request: Request, pk: str) -> Response:
        """The tenant's idle rule: read by anyone who sees the tenant, set (PUT) or removed
        (DELETE: it follows the rule above) by its admins."""
        tenant = self.get_object()
        if request.method == "PUT":
            data = self.read_input(s.IdleRuleIn)
            idle_rules.idle_rule_set(
                user=request.user,
                tenant=tenant,
                threshold_pct=data["threshold_pct"],
                duration_s=data["duration_minutes"] * 60,
                action=data["action"],
            )
        elif request.method == "DELETE":
            idle_rules.idle_rule_delete(user=request.user, tenant=tenant)
            return Response(status=status.HTTP_204_NO_CONTENT)  # GET tells the rule now in force
        return Response(s.IdleRuleOut(idle_rules.idle_rule_view(tenant)).data)

    @extend_schema(request=None, responses=s.AllowedRegistriesOut, methods=["GET"])
    @extend_schema(request=s.AllowedRegistriesIn, responses=s.AllowedRegistriesOut, methods=["PUT"])
    @action(detail=True, methods=["get", "put"], url_path="registries", url_name="registries")
    def allowed_registries(self, request: Request, pk: str) -> Response:
        """The registries the tenant's jobs may pull images from: read by anyone who sees the
        tenant, set (PUT; an empty list follows the list above) by admins above it."""
        tenant = self.get_object()
        if request.method == "PUT":
            data = self.read_input(s.AllowedRegistriesIn)
            tenant = registries.allowed_registries_set(
                user=request.user, tenant=tenant, entries=data["allowed_registries"]
            )
        return Response(s.AllowedRegistriesOut(registries.registries_view(tenant)).data)

    @extend_schema(responses=s.WebhookHealthOut)
    @action(detail=True, methods=["get"], url_path="webhook", url_name="webhook")
    def webhook(self, request: Request, pk: str) -> Response:
        """The webhook's health, for the tenant's admins (and, read-only, finance): last
        success, last failure and its error, and the notifications waiting, given up and
        dropped. Only those who may change the URL read it whole; finance gets its host."""
        tenant = self.get_object()
        manages = access.can_manage_tenant(request.user, tenant)
        if not manages and not access.grants_for(request.user).sees_everything:
            raise PermissionDenied(f"You are not an admin of tenant '{tenant.slug}'.")
        health = outbox.webhook_health(tenant)
        if not manages:
            health = replace(health, url=outbox.redact_url(health.url))
        return Response(s.WebhookHealthOut(health).data)

    @extend_schema(request=None, responses=s.WebhookSecretOut)
    @action(detail=True, methods=["post"], url_path="webhook/secret", url_name="webhooksecret")
    def webhook_secret(self, request: Request, pk: str) -> Response:
        """Rotate the webhook's signing secret: the new one is answered this once."""
        tenant = self.get_object()
        refuse_any_body(request.data)
        secret = services.webhook_secret_rotate(user=request.user, tenant=tenant)
        return Response(s.WebhookSecretOut({"secret": secret}).data)

    @extend_schema(request=None, responses={202: s.WebhookTestOut})
    @action(detail=True, methods=["post"], url_path="webhook/test", url_name="webhooktest")
    def webhook_test(self, request: Request, pk: str) -> Response:
        """Queue a test message to the tenant's webhook; its outcome shows in the health."""
        tenant = self.get_object()
        refuse_any_body(request.data)
        row = services.webhook_test_send(user=request.user, tenant=tenant)
        return Response(s.WebhookTestOut(row).data, status=status.HTTP_202_ACCEPTED)


class ProjectViewSet(ReadWriteViewSet):
    output_serializer = s.ProjectOut
    filterset_fields = ["tenant", "slug", "namespace"]

    def get_queryset(self) -> Any:
        return access.projects_visible(self.request.user)

    @extend_schema(request=s.ProjectCreateIn, responses={201: s.ProjectOut})
    def create(self, request: Request) -> Response:
        data = self.read_input(s.ProjectCreateIn)
        return self.respond(services.project_create(user=request.user, **data), 201)

    @extend_schema(request=s.ProjectUpdateIn, responses=s.ProjectOut)
    def partial_update(self, request: Request, pk: str) -> Response:
        project = self.get_object()
        data = self.read_input(s.ProjectUpdateIn, partial=True)
        return self.respond(services.project_update(user=request.user, project=project, **data))


class MembershipViewSet(ReadWriteViewSet):
    output_serializer = s.MembershipOut
    filterset_fields = ["tenant", "user", "role"]

    def get_queryset(self) -> Any:
        return access.visible_by_tenant(
            self.request.user, Membership.objects.select_related("user", "tenant")
        )

    @extend_schema(request=s.MembershipCreateIn, responses={201: s.MembershipOut})
    def create(self, request: Request) -> Response:
        data = self.read_input(s.MembershipCreateIn)
        membership = services.membership_add(
            user=request.user, tenant=data["tenant"], username=data["username"], role=data["role"]
        )
        return self.respond(membership, status.HTTP_201_CREATED)

    @extend_schema(request=s.MembershipUpdateIn, responses=s.MembershipOut)
    def partial_update(self, request: Request, pk: str) -> Response:
        membership = self.get_object()
        data = self.read_input(s.MembershipUpdateIn, partial=True)
        # A PATCH without `role` (as its schema allows) sets the role it has: checked, audited.
        role = data.get("role", membership.role)
        membership = services.membership_set(
            user=request.user, tenant=membership.tenant, member=membership.user, role=role
        )
        return self.respond(membership)

    def destroy(self, request: Request, pk: str) -> Response:
        services.membership_delete(user=request.user, membership=self.get_object())
        return Response(status=status.HTTP_204_NO_CONTENT)


class FlavorViewSet(ReadWriteViewSet):
    output_serializer = s.FlavorSerializer
    filterset_fields = ["kind", "name"]
    queryset = ResourceFlavor.objects.all()

    def create(self, request: Request) -> Response:
        data = self.read_input(s.FlavorSerializer)
        flavor = services.flavor_save(user=request.user, flavor=ResourceFlavor(**data))
        return self.respond(flavor, status.HTTP_201_CREATED)

    def partial_update(self, request: Request, pk: str) -> Response:
        flavor = self.get_object()
        for key, value in self.read_input(s.FlavorSerializer, partial=True).items():
            setattr(flavor, key, value)
        return self.respond(services.flavor_save(user=request.user, flavor=flavor))


class QuotaFilter(StrictFilterSet):
    flavor_name = django_filters.CharFilter(field_name="flavor__name")
    cluster_name = django_filters.CharFilter(field_name="cluster__name")
    pinned = django_filters.BooleanFilter(
        field_name="cluster", lookup_expr="isnull", exclude=True, label="Pinned to a cluster."
    )

    class Meta:
        model = Quota
        fields = ["tenant", "flavor", "flavor_name", "cluster", "cluster_name", "pinned"]


class QuotaViewSet(ReadWriteViewSet):
    output_serializer = s.QuotaOut
    filterset_class = QuotaFilter

    def get_queryset(self) -> Any:
        return selectors.quota_list_visible(self.request.user)

    @extend_schema(request=s.QuotaCreateIn, responses={201: s.QuotaOut})
    def create(self, request: Request) -> Response:
        data = self.read_input(s.QuotaCreateIn)
        tenant, flavor, cluster = data.pop("tenant"), data.pop("flavor"), data.pop("cluster")
        quota = services.quota_set(
            user=request.user,
            tenant=tenant,
            flavor=flavor,
            values=QuotaValues(**data),
            cluster=cluster,
        )
        return self.respond(quota, status.HTTP_201_CREATED)

    @extend_schema(request=s.QuotaValuesIn, responses=s.QuotaOut)
    def partial_update(self, request: Request, pk: str) -> Response:
        quota = self.get_object()
        current = {
            "guaranteed_milli": quota.guaranteed_milli,
            "limit_milli": quota.limit_milli,
            "lend_limit_milli": quota.lend_limit_milli,
            "weight": float(quota.weight),
            "user_limit_milli": quota.user_limit_milli,
        }
        if not isinstance(request.data, dict):
            raise ValidationError({"non_field_errors": ["expected a JSON object."]})
        serializer = s.QuotaValuesIn(data={**current, **request.data}, context={"request": request})
        serializer.is_valid(raise_exception=True)
        quota = services.quota_set(
            user=request.user,
            tenant=quota.tenant,
            flavor=quota.flavor,
            values=QuotaValues(**serializer.validated_data),
            cluster=quota.cluster,
        )
        return self.respond(quota)

    def destroy(self, request: Request, pk: str) -> Response:
        services.quota_delete(user=request.user, quota=self.get_object())
        return Response(status=status.HTTP_204_NO_CONTENT)


class PriorityClassViewSet(ReadWriteViewSet):
    output_serializer = s.PriorityClassSerializer
    queryset = PriorityClass.objects.all()
    filterset_fields = ["name", "may_preempt", "preemptible"]

    def create(self, request: Request) -> Response:
        data = self.read_input(s.PriorityClassSerializer)
        pc = services.priority_class_save(user=request.user, priority_class=PriorityClass(**data))
        return self.respond(pc, status.HTTP_201_CREATED)

    def partial_update(self, request: Request, pk: str) -> Response:
        pc = self.get_object()
        for key, value in self.read_input(s.PriorityClassSerializer, partial=True).items():
            setattr(pc, key, value)
        return self.respond(services.priority_class_save(user=request.user, priority_class=pc))


class PriorityDefaultViewSet(ReadWriteViewSet):
    output_serializer = s.PriorityDefaultOut
    filterset_fields = ["tenant", "job_type"]

    def get_queryset(self) -> Any:
        return selectors.priority_default_list_visible(self.request.user)

    @extend_schema(request=s.PriorityDefaultIn, responses={201: s.PriorityDefaultOut})
    def create(self, request: Request) -> Response:
        row = services.priority_default_set(
            user=request.user, **self.read_input(s.PriorityDefaultIn)
        )
        return self.respond(row, status.HTTP_201_CREATED)

    def destroy(self, request: Request, pk: str) -> Response:
        row: PriorityDefault = self.get_object()
        services.priority_default_delete(user=request.user, row=row)
        return Response(status=status.HTTP_204_NO_CONTENT)


class MeView(APIView):
    @extend_schema(responses=s.MeOut)
    def get(self, request: Request) -> Response:
        grants = access.grants_for(request.user)
        roles = [
            name
            for name, held in (
                ("platform_admin", grants.platform_admin),
                ("finance", grants.finance),
            )
            if held
        ]
        memberships = Membership.objects.filter(user_id=request.user.pk or 0).select_related("user")
        data = {
            "username": request.user.get_username(),
            "platform_roles": roles,
            "memberships": memberships,
        }
        return Response(s.MeOut(data).data)
