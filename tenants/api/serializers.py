"""Input and output serializers of the organisation API, one pair per operation."""

from __future__ import annotations

from typing import Any

from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from common.api.serializers import StrictInputSerializer, refuse_loose_input
from tenants import access
from tenants.models import (
    IdleAction,
    JobType,
    Membership,
    PriorityClass,
    PriorityDefault,
    Project,
    Quota,
    ResourceFlavor,
    Role,
    Tenant,
    TenantKind,
)

# A priority class's value: Kubernetes' bound for user-defined classes (one billion).
PRIORITY_BOUND = 10**9


@extend_schema_field(OpenApiTypes.INT)
class VisibleTenantField(serializers.PrimaryKeyRelatedField):
    """A tenant id the requesting user can see; others read as 'does not exist'."""

    def get_queryset(self) -> Any:
        return access.tenants_visible(self.context["request"].user)


# --- tenants -----------------------------------------------------------------------------


class TenantOut(serializers.ModelSerializer):
    class Meta:
        model = Tenant
        fields = ["id", "slug", "name", "kind", "parent", "depth", "created_at"]


class TenantCreateIn(StrictInputSerializer):
    # DRF moves declared fields off the class, so this does not shadow Field.parent.
    parent = VisibleTenantField(allow_null=True, required=False, default=None)  # type: ignore[assignment]
    slug = serializers.CharField(max_length=63)
    name = serializers.CharField(max_length=120)
    kind = serializers.ChoiceField(choices=TenantKind.choices, default=TenantKind.TEAM)


# The https URLs the model's URLValidator takes, as a pattern the schema can state: DNS labels
# (letters, digits, inner hyphens), a TLD of letters, an optional port and path.
_LABEL = r"[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
WEBHOOK_URL = rf"^(https://({_LABEL}\.)+[A-Za-z]{{2,63}}(:[0-9]{{1,5}})?(/[^\s]*)?)?\Z"


class TenantUpdateIn(StrictInputSerializer):
    name = serializers.CharField(max_length=120)
    webhook_url = serializers.RegexField(
        WEBHOOK_URL,
        max_length=500,
        allow_blank=True,
        help_text='https URL the tenant\'s notifications are posted to as {"text": ...} '
        "(Slack, Teams; docs/notifications.md), on a public host; empty removes it. Setting "
        "one where there was none answers its signing secret, once.",
    )


class TenantUpdateOut(TenantOut):
    webhook_secret = serializers.CharField(
        source="webhook_secret_new",
        allow_null=True,
        read_only=True,
        help_text="The webhook's new signing secret, shown this once: set when this request "
        "gave the tenant a webhook where it had none; null otherwise. Receivers verify the "
        "X-Gantry-Signature header with it (docs/notifications.md).",
    )

    class Meta(TenantOut.Meta):
        fields = [*TenantOut.Meta.fields, "webhook_secret"]


class WebhookSecretOut(serializers.Serializer):
    secret = serializers.CharField(
        help_text="The new signing secret, shown this once; the old one no longer signs."
    )


class WebhookHealthOut(serializers.Serializer):
    """The tenant's webhook as its admins see it (tenants/outbox.py)."""

    url = serializers.CharField(help_text="The full URL (admins only); empty: none set.")
    last_success_at = serializers.DateTimeField(allow_null=True)
    last_failure_at = serializers.DateTimeField(allow_null=True)
    last_error = serializers.CharField()
    undelivered = serializers.IntegerField(help_text="Waiting to be sent (or retried).")
    failed = serializers.IntegerField(help_text="Given up after the most attempts.")
    dropped = serializers.IntegerField(help_text="Pushed out by newer ones past the bound.")


class WebhookTestOut(serializers.Serializer):
    notification = serializers.IntegerField(source="pk")
    state = serializers.CharField()


class IdleRuleValues(serializers.Serializer):
    threshold_pct = serializers.FloatField(min_value=0, max_value=100)
    duration_minutes = serializers.IntegerField(min_value=1, max_value=7 * 24 * 60)
    action = serializers.ChoiceField(choices=IdleAction.choices)


class IdleRuleIn(StrictInputSerializer, IdleRuleValues):
    pass


class EffectiveIdleRuleOut(IdleRuleValues):
    origin = serializers.ChoiceField(
        choices=["own", "inherited", "default"],
        help_text="own: this tenant's rule; inherited: from a tenant above; default: the "
        "settings' (no tenant up the tree sets one).",
    )


class IdleRuleOut(serializers.Serializer):
    tenant = serializers.IntegerField()
    own = IdleRuleValues(allow_null=True, help_text="This tenant's own rule, if it sets one.")
    effective = EffectiveIdleRuleOut(help_text="The rule in force for the tenant's jobs.")


class AllowedRegistriesIn(StrictInputSerializer):
    allowed_registries = serializers.ListField(
        child=serializers.CharField(max_length=255),
        max_length=64,
        allow_empty=True,
        help_text="Registry hosts or host/path prefixes (nvcr.io/nvidia, docker.io/pytorch); "
        "each within the lists above. Empty: follow the list above.",
    )


class AllowedRegistriesOut(serializers.Serializer):
    tenant = serializers.IntegerField()
    own = serializers.ListField(
        child=serializers.CharField(), help_text="This tenant's own list; empty: none set."
    )
    effective = serializers.ListField(
        child=serializers.CharField(),
        allow_null=True,
        help_text="The nearest list up the tree (each list above binds too); null: every "
        "registry is allowed.",
    )
    origin = serializers.ChoiceField(
        choices=["own", "inherited", "default"],
        help_text="own: this tenant's list; inherited: from a tenant above; default: no list "
        "up the tree.",
    )


# --- projects ----------------------------------------------------------------------------


class ProjectOut(serializers.ModelSerializer):
    class Meta:
        model = Project
        fields = ["id", "tenant", "slug", "name", "namespace", "created_at"]


class ProjectCreateIn(StrictInputSerializer):
    tenant = VisibleTenantField()
    slug = serializers.CharField(max_length=63)
    name = serializers.CharField(max_length=120)
    namespace = serializers.CharField(
        max_length=63,
        required=False,
        default=None,
        help_text="Platform admins only: an existing namespace to assign, which must carry "
        "the label app.kubernetes.io/managed-by=gantry. Left out, Gantry creates and owns a "
        "namespace named after the slug.",
    )


class ProjectUpdateIn(StrictInputSerializer):
    name = serializers.CharField(max_length=120)


# --- memberships -------------------------------------------------------------------------


class MembershipOut(serializers.ModelSerializer):
    username = serializers.CharField(source="user.username", read_only=True)

    class Meta:
        model = Membership
        fields = ["id", "tenant", "user", "username", "role", "created_at"]


class MembershipCreateIn(StrictInputSerializer):
    # A name, looked up by `membership_add` only after the caller's right to add members:
    # looking it up here told anyone which usernames exist.
    tenant = VisibleTenantField()
    username = serializers.CharField(max_length=150)
    role = serializers.ChoiceField(choices=Role.choices, default=Role.MEMBER)


class MembershipUpdateIn(StrictInputSerializer):
    role = serializers.ChoiceField(choices=Role.choices)


# --- flavors -----------------------------------------------------------------------------


@extend_schema_field({"type": "array", "items": {"type": "string", "maxLength": 32}})
class MigProfilesField(serializers.JSONField):
    """A JSON list of MIG profile names, checked by `FlavorSerializer`; documented as such."""


@extend_schema_field({"type": "object", "additionalProperties": {"type": "string"}})
class NodeLabelsField(serializers.JSONField):
    """A JSON object of label name -> value, checked by `FlavorSerializer`."""


class FlavorSerializer(serializers.ModelSerializer):
    mig_profiles = MigProfilesField(required=False)
    node_labels = NodeLabelsField(required=False)

    class Meta:
        model = ResourceFlavor
        fields = [
            "id",
            "name",
            "kind",
            "resource_name",
            "memory_mib",
            "mig_profiles",
            "node_labels",
        ]

    def to_internal_value(self, data: Any) -> Any:
        refuse_loose_input(self, data)
        return super().to_internal_value(data)

    def validate_mig_profiles(self, value: Any) -> list[str]:
        if not isinstance(value, list) or not all(
            isinstance(p, str) and len(p) <= 32 for p in value
        ):
            raise serializers.ValidationError("must be a list of MIG profile names like '1g.10gb'.")
        return value

    def validate_node_labels(self, value: Any) -> dict[str, str]:
        if not isinstance(value, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in value.items()
        ):
            raise serializers.ValidationError("must map label names to string values.")
        return value


# --- quotas ------------------------------------------------------------------------------


class QuotaOut(serializers.ModelSerializer):
    tenant_slug = serializers.CharField(source="tenant.slug", read_only=True)
    flavor_name = serializers.CharField(source="flavor.name", read_only=True)
    cluster_name = serializers.CharField(
        source="cluster.name",
        read_only=True,
        allow_null=True,
        default=None,
        help_text="The cluster the quota is pinned to; null: global (every cluster).",
    )
    weight = serializers.FloatField()

    class Meta:
        model = Quota
        fields = [
            "id",
            "tenant",
            "tenant_slug",
            "flavor",
            "flavor_name",
            "cluster",
            "cluster_name",
            "guaranteed_milli",
            "limit_milli",
            "lend_limit_milli",
            "weight",
            "user_limit_milli",
            "updated_at",
        ]


# A quota's bounds, one place for every input that sets or proposes one (the quota itself, a
# quota request, a what-if's proposal reads them from QuotaValuesIn).
MAX_QUOTA_MILLI = 10**12
MIN_WEIGHT, MAX_WEIGHT = 0.001, 10000


class QuotaValuesIn(StrictInputSerializer):
    guaranteed_milli = serializers.IntegerField(min_value=0, max_value=MAX_QUOTA_MILLI)
    limit_milli = serializers.IntegerField(min_value=0, max_value=MAX_QUOTA_MILLI)
    lend_limit_milli = serializers.IntegerField(
        min_value=0, max_value=MAX_QUOTA_MILLI, required=False, allow_null=True, default=None
    )
    weight = serializers.FloatField(
        min_value=MIN_WEIGHT, max_value=MAX_WEIGHT, required=False, default=1.0
    )
    user_limit_milli = serializers.IntegerField(
        min_value=0, max_value=MAX_QUOTA_MILLI, required=False, allow_null=True, default=None
    )


class QuotaCreateIn(QuotaValuesIn):
    tenant = VisibleTenantField()
    flavor = serializers.PrimaryKeyRelatedField(queryset=ResourceFlavor.objects.all())
    # Through the relation: tenants imports nothing of scheduler, where clusters live.
    cluster = serializers.PrimaryKeyRelatedField(
        queryset=Quota._meta.get_field("cluster").related_model._default_manager.all(),
        required=False,
        allow_null=True,
        default=None,
        help_text="A cluster's id: the quota holds for its nodes only. Null: global.",
    )


# --- priorities --------------------------------------------------------------------------


class PriorityClassSerializer(serializers.ModelSerializer):
    def to_internal_value(self, data: Any) -> Any:
        refuse_loose_input(self, data)
        return super().to_internal_value(data)

    class Meta:
        model = PriorityClass
        fields = [
            "id",
            "name",
            "value",
            "may_preempt",
            "preemptible",
            "counts_against_quota",
            "description",
        ]
        # The same range in the schema on every database, where the column's would differ.
        extra_kwargs = {"value": {"min_value": -PRIORITY_BOUND, "max_value": PRIORITY_BOUND}}


class PriorityDefaultOut(serializers.ModelSerializer):
    priority_class: Any = serializers.SlugRelatedField(slug_field="name", read_only=True)

    class Meta:
        model = PriorityDefault
        fields = ["id", "tenant", "job_type", "priority_class"]


class PriorityDefaultIn(StrictInputSerializer):
    tenant = VisibleTenantField(allow_null=True, required=False, default=None)
    job_type = serializers.ChoiceField(choices=JobType.choices)
    priority_class = serializers.SlugRelatedField(
        slug_field="name", queryset=PriorityClass.objects.all()
    )


class MeOut(serializers.Serializer):
    username = serializers.CharField()
    platform_roles = serializers.ListField(child=serializers.CharField())
    memberships = MembershipOut(many=True)
