"""Serializers of the what-if API: a proposal in, a run (with the viewer's results) out."""

from __future__ import annotations

from typing import Any

from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from common.api.serializers import StrictInputSerializer
from tenants.api.serializers import MAX_QUOTA_MILLI, MAX_WEIGHT, MIN_WEIGHT, PRIORITY_BOUND
from whatif.models import MAX_WINDOW_DAYS, WhatIf
from whatif.present import results_for

KINDS = [("quota", "quota"), ("priority_class", "priority_class")]

# A what-if proposes only a setting that could then be made: the quota's own bounds.
MAX_MILLI = MAX_QUOTA_MILLI
WEIGHT_MIN, WEIGHT_MAX = MIN_WEIGHT, MAX_WEIGHT


class ChangeIn(StrictInputSerializer):
    """One change: a tenant's quota of a flavor, or a priority class's value."""

    kind = serializers.ChoiceField(KINDS)
    tenant = serializers.CharField(required=False, max_length=63, help_text="A tenant's slug.")
    flavor = serializers.CharField(required=False, max_length=63, help_text="A flavor's name.")
    cluster = serializers.CharField(
        required=False,
        allow_null=True,
        max_length=63,
        help_text="A cluster's name: the quota pinned to it. Omitted or null: the global quota.",
    )
    guaranteed_milli = serializers.IntegerField(required=False, min_value=0, max_value=MAX_MILLI)
    limit_milli = serializers.IntegerField(required=False, min_value=0, max_value=MAX_MILLI)
    lend_limit_milli = serializers.IntegerField(
        required=False, allow_null=True, min_value=0, max_value=MAX_MILLI
    )
    weight = serializers.FloatField(required=False, min_value=WEIGHT_MIN, max_value=WEIGHT_MAX)
    user_limit_milli = serializers.IntegerField(
        required=False,
        allow_null=True,
        min_value=0,
        max_value=MAX_MILLI,
        help_text="One user's cap.",
    )
    name = serializers.CharField(required=False, max_length=63, help_text="A priority class.")
    value = serializers.IntegerField(
        required=False, min_value=-PRIORITY_BOUND, max_value=PRIORITY_BOUND
    )

    QUOTA = {
        "tenant",
        "flavor",
        "cluster",
        "guaranteed_milli",
        "limit_milli",
        "lend_limit_milli",
        "weight",
        "user_limit_milli",
    }
    CLASS = {"name", "value"}

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        own, needed = (
            (self.QUOTA, ("tenant", "flavor"))
            if attrs["kind"] == "quota"
            else (self.CLASS, ("name", "value"))
        )
        errors = {
            k: [f"not part of a {attrs['kind']} change."] for k in attrs if k not in {*own, "kind"}
        }
        errors.update({k: ["This field is required."] for k in needed if k not in attrs})
        if errors:
            raise serializers.ValidationError(errors)
        return attrs


def _milli(nullable: bool = False) -> dict[str, Any]:
    return {"type": "integer", "minimum": 0, "maximum": MAX_MILLI, "nullable": nullable}


def _name(description: str) -> dict[str, Any]:
    return {"type": "string", "minLength": 1, "maxLength": 63, "description": description}


# What `ChangeIn.validate` enforces, as the schema's own words: the fields of each kind, and
# no other (a flat object of every field would call `{"kind": "quota"}` valid).
CHANGE_SCHEMA = {
    "oneOf": [
        {
            "type": "object",
            "properties": {
                "kind": {"type": "string", "enum": ["quota"]},
                "tenant": _name("A tenant's slug."),
                "flavor": _name("A flavor's name."),
                "cluster": {
                    **_name("A cluster's name: the quota pinned to it; null: global."),
                    "nullable": True,
                },
                "guaranteed_milli": _milli(),
                "limit_milli": _milli(),
                "lend_limit_milli": _milli(nullable=True),
                "weight": {"type": "number", "minimum": WEIGHT_MIN, "maximum": WEIGHT_MAX},
                "user_limit_milli": {**_milli(nullable=True), "description": "One user's cap."},
            },
            "required": ["kind", "tenant", "flavor"],
            "additionalProperties": False,
        },
        {
            "type": "object",
            "properties": {
                "kind": {"type": "string", "enum": ["priority_class"]},
                "name": _name("A priority class."),
                "value": {"type": "integer", "minimum": -PRIORITY_BOUND, "maximum": PRIORITY_BOUND},
            },
            "required": ["kind", "name", "value"],
            "additionalProperties": False,
        },
    ]
}


@extend_schema_field({"type": "array", "items": CHANGE_SCHEMA, "maxItems": 50})
class ChangesField(serializers.ListField):
    pass


class WhatIfIn(StrictInputSerializer):
    scope = serializers.IntegerField(
        required=False,
        allow_null=True,
        min_value=1,
        help_text="The tenant (id) whose subtree the run is for; omit for the whole platform "
        "(platform admins).",
    )
    window_days = serializers.IntegerField(default=14, min_value=1, max_value=MAX_WINDOW_DAYS)
    changes = ChangesField(child=ChangeIn(), required=False, max_length=50)
    approval_request = serializers.IntegerField(
        required=False,
        min_value=1,
        help_text="A quota request (id) whose change to replay instead of `changes`.",
    )

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        if "approval_request" in attrs:
            if attrs.get("changes") or "scope" in attrs:
                raise serializers.ValidationError(
                    {"approval_request": ["replays the request's own change: no changes or scope."]}
                )
        elif not attrs.get("changes"):
            raise serializers.ValidationError({"changes": ["propose at least one change."]})
        return attrs


class WhatIfProgressOut(serializers.Serializer):
    percent = serializers.IntegerField()
    stage = serializers.CharField(help_text="What the replay is doing.")


class WhatIfOut(serializers.ModelSerializer):
    # null: the whole platform (scope); a run not replaying a quota request (approval_request).
    scope = serializers.SlugRelatedField[Any](slug_field="slug", read_only=True, allow_null=True)
    requested_by = serializers.SlugRelatedField[Any](slug_field="username", read_only=True)
    approval_request = serializers.PrimaryKeyRelatedField[Any](
        source="approval", read_only=True, allow_null=True
    )
    progress = serializers.SerializerMethodField()
    results = serializers.SerializerMethodField()
    changes_described = serializers.ListField(
        child=serializers.CharField(),
        read_only=True,
        help_text="Each change in words, each figure with its unit (GPUs, a bare weight).",
    )

    class Meta:
        model = WhatIf
        fields = [
            "id",
            "scope",
            "requested_by",
            "window_days",
            "changes",
            "changes_described",
            "approval_request",
            "state",
            "progress",
            "error",
            "created_at",
            "started_at",
            "finished_at",
            "expires_at",
            "results",
        ]

    @extend_schema_field(WhatIfProgressOut)
    def get_progress(self, run: WhatIf) -> dict[str, Any]:
        return {"percent": run.progress, "stage": run.stage}

    @extend_schema_field({"type": "object", "nullable": True})
    def get_results(self, run: WhatIf) -> dict[str, Any] | None:
        """Side by side (`baseline`, `proposed`): totals, and one row per tenant the viewer
        may see, everyone else as one `others` row. Only on a run's own page."""
        if not self.context.get("detail"):
            return None
        return results_for(self.context["request"].user, run)
