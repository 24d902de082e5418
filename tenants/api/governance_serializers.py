"""Serializers of the governance API: approval policies, approval requests, audit entries."""

from __future__ import annotations

import json
from typing import Any

from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from tenants.api.serializers import (
    MAX_QUOTA_MILLI,
    MAX_WEIGHT,
    MIN_WEIGHT,
    QuotaValuesIn,
    StrictInputSerializer,
    VisibleTenantField,
)
from tenants.approval_rules import policy_describe
from tenants.models import (
    ApprovalPolicy,
    ApprovalRequest,
    ApprovalRule,
    AuditEntry,
    PriorityClass,
    Quota,
    ResourceFlavor,
)

# --- policies ----------------------------------------------------------------------------


class ApprovalPolicyOut(serializers.ModelSerializer):
    tenant_slug = serializers.CharField(source="tenant.slug", read_only=True)
    threshold = serializers.FloatField(allow_null=True)
    priority_class: serializers.SlugRelatedField[PriorityClass] = serializers.SlugRelatedField(
        slug_field="name", read_only=True, allow_null=True
    )
    summary = serializers.SerializerMethodField()
    set_at = serializers.IntegerField(
        source="set_at_id",
        allow_null=True,
        read_only=True,
        help_text="The tenant whose admins set it (the policy's or an ancestor); null: a "
        "platform admin. Only they, or those above, change, deactivate or delete it.",
    )

    class Meta:
        model = ApprovalPolicy
        fields = [
            "id",
            "tenant",
            "tenant_slug",
            "rule",
            "threshold",
            "priority_class",
            "applies_to_jobs",
            "applies_to_quota",
            "active",
            "description",
            "summary",
            "set_at",
            "created_at",
            "updated_at",
        ]

    def get_summary(self, policy: ApprovalPolicy) -> str:
        return policy_describe(policy)


class ApprovalPolicyUpdateIn(StrictInputSerializer):
    rule = serializers.ChoiceField(choices=ApprovalRule.choices)
    threshold = serializers.FloatField(
        min_value=0,
        max_value=1e9,
        allow_null=True,
        required=False,
        default=None,
        help_text=(
            "GPUs, GPU-hours, hours or money (cost_over); none for 'priority_at_least' and "
            "'borrowing'."
        ),
    )
    priority_class = serializers.SlugRelatedField(
        slug_field="name",
        queryset=PriorityClass.objects.all(),
        allow_null=True,
        required=False,
        default=None,
        help_text="For 'priority_at_least' only.",
    )
    applies_to_jobs = serializers.BooleanField(required=False, default=True)
    applies_to_quota = serializers.BooleanField(required=False, default=False)
    active = serializers.BooleanField(required=False, default=True)
    description = serializers.CharField(
        max_length=200, required=False, allow_blank=True, default=""
    )


class ApprovalPolicyCreateIn(ApprovalPolicyUpdateIn):
    tenant = VisibleTenantField()


# --- requests ----------------------------------------------------------------------------


class ApprovalRequestOut(serializers.ModelSerializer):
    tenant_slug = serializers.CharField(source="tenant.slug", read_only=True)
    requester = serializers.CharField(source="requester.username", read_only=True)
    decided_by = serializers.CharField(
        source="decided_by.username", default=None, read_only=True, allow_null=True
    )
    reasons = serializers.ListField(child=serializers.CharField(), read_only=True)
    payload = serializers.JSONField(read_only=True)

    class Meta:
        model = ApprovalRequest
        fields = [
            "id",
            "kind",
            "state",
            "tenant",
            "tenant_slug",
            "requester",
            "subject_id",
            "payload",
            "reasons",
            "decided_by",
            "decided_at",
            "comment",
            "expires_at",
            "created_at",
        ]


class ApprovalDecisionIn(StrictInputSerializer):
    comment = serializers.CharField(max_length=1000, required=False, allow_blank=True, default="")


class QuotaRequestIn(QuotaValuesIn):
    """Only the values named: approving the request changes those and keeps the others as
    the quota has them then (a field left out is absent, not its default)."""

    guaranteed_milli = serializers.IntegerField(
        min_value=0,
        max_value=MAX_QUOTA_MILLI,
        required=False,
        help_text="Required when the tenant has no such quota yet.",
    )
    limit_milli = serializers.IntegerField(
        min_value=0,
        max_value=MAX_QUOTA_MILLI,
        required=False,
        help_text="Required when the tenant has no such quota yet.",
    )
    lend_limit_milli = serializers.IntegerField(
        min_value=0,
        max_value=MAX_QUOTA_MILLI,
        required=False,
        allow_null=True,
        help_text="null: none.",
    )
    weight = serializers.FloatField(min_value=MIN_WEIGHT, max_value=MAX_WEIGHT, required=False)
    user_limit_milli = serializers.IntegerField(
        min_value=0,
        max_value=MAX_QUOTA_MILLI,
        required=False,
        allow_null=True,
        help_text="null: none.",
    )
    tenant = VisibleTenantField()
    flavor = serializers.PrimaryKeyRelatedField(queryset=ResourceFlavor.objects.all())
    # Through the relation: tenants imports nothing of scheduler, where clusters live.
    cluster = serializers.PrimaryKeyRelatedField(
        queryset=Quota._meta.get_field("cluster").related_model._default_manager.all(),
        required=False,
        allow_null=True,
        default=None,
        help_text="A cluster's id: the request is for the quota pinned to it. Null: global.",
    )
    justification = serializers.CharField(
        max_length=1000, required=False, allow_blank=True, default=""
    )


# --- audit -------------------------------------------------------------------------------


@extend_schema_field(OpenApiTypes.OBJECT)
class AuditStateField(serializers.JSONField):
    """The object's state before or after the change; null when it did not exist."""


class AuditEntryOut(serializers.ModelSerializer):
    actor = serializers.CharField(source="actor_name", read_only=True)
    tenant_slug = serializers.CharField(
        source="tenant.slug", default=None, read_only=True, allow_null=True
    )
    before = AuditStateField(read_only=True, allow_null=True)
    after = AuditStateField(read_only=True, allow_null=True)

    class Meta:
        model = AuditEntry
        fields = [
            "id",
            "at",
            "actor",
            "action",
            "tenant",
            "tenant_slug",
            "target_type",
            "target_id",
            "before",
            "after",
        ]


def audit_csv_row(entry: AuditEntry) -> list[Any]:
    """The export's columns, in the order of AUDIT_CSV_HEADER (cells escaped by the caller)."""
    return [
        entry.at.isoformat(),
        entry.actor_name or "system",
        entry.action,
        entry.tenant.slug if entry.tenant else "",
        entry.target_type,
        entry.target_id,
        json.dumps(entry.before, sort_keys=True),
        json.dumps(entry.after, sort_keys=True),
    ]


AUDIT_CSV_HEADER = [
    "at",
    "actor",
    "action",
    "tenant",
    "target_type",
    "target_id",
    "before",
    "after",
]
