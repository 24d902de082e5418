"""Input and output serializers of the capacity API. Money travels as decimal strings."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

from rest_framework import serializers

from billing.api.serializers import DecimalStringField
from capacity.models import PoolTarget, RateSuggestion, TcoInputs
from capacity.services import TCO_FIELDS
from common.api.serializers import StrictInputSerializer
from tenants.models import ResourceFlavor

MAX_OPTION_GPUS = 10_000


class FractionField(DecimalStringField):
    """A share as a decimal string: above 0, at most 1 ("0.8" = 80%)."""

    def to_internal_value(self, data: Any) -> Decimal:
        value = super().to_internal_value(data)
        if not Decimal(0) < value <= Decimal(1):
            self.fail_decimal('must be above 0 and at most 1, such as "0.8" for 80%.')
        return value


class PlansQueryIn(serializers.Serializer):
    """Query values (text): the page's parameters are the paginator's."""

    flavor = serializers.CharField(
        required=False, min_length=1, max_length=63, help_text="One pool (a GPU model's name)."
    )
    gpus = serializers.IntegerField(
        required=False,
        min_value=-MAX_OPTION_GPUS,
        max_value=MAX_OPTION_GPUS,
        help_text="An expansion option of your own: GPUs added (negative: removed).",
    )


class ExportQueryIn(PlansQueryIn):
    format = serializers.ChoiceField(choices=["csv", "xlsx"], default="csv")


class FigureOut(serializers.Serializer):
    value = serializers.FloatField(allow_null=True)
    explain = serializers.CharField()
    inputs = serializers.DictField(child=serializers.FloatField())


class SaturationOut(serializers.Serializer):
    limit_gpu_hours_per_day = serializers.FloatField()
    p50_day = serializers.DateField(allow_null=True)
    p90_day = serializers.DateField(allow_null=True)
    explain = serializers.CharField()


class DriverOut(serializers.Serializer):
    name = serializers.CharField(help_text="The subtree's tenant slug.")
    recent = serializers.FloatField(help_text="GPU-hours a day, the last week of history.")
    ahead = serializers.FloatField(help_text="GPU-hours a day (p50), the week 90 days ahead.")
    growth = serializers.FloatField()
    share = serializers.FloatField(help_text="Of the growth of all growing subtrees.")


class MonthOut(serializers.Serializer):
    index = serializers.IntegerField()
    gpu_hours = serializers.FloatField()
    own = serializers.FloatField()
    on_demand = serializers.FloatField()
    committed = serializers.FloatField()


class OptionOut(serializers.Serializer):
    gpus = serializers.IntegerField()
    saturation = SaturationOut()
    months = MonthOut(many=True)
    break_even_month = FigureOut(allow_null=True)
    own_total = serializers.FloatField()
    on_demand_total = serializers.FloatField()
    committed_total = serializers.FloatField()


class SeriesOut(serializers.Serializer):
    requested = serializers.ListField(child=serializers.FloatField())
    allocated = serializers.ListField(child=serializers.FloatField())
    used = serializers.ListField(child=serializers.FloatField())
    p10 = serializers.ListField(child=serializers.FloatField())
    p50 = serializers.ListField(child=serializers.FloatField())
    p90 = serializers.ListField(child=serializers.FloatField())
    baseline = serializers.ListField(child=serializers.FloatField())
    method = serializers.CharField()


class PlanOut(serializers.Serializer):
    flavor = serializers.CharField()
    subtree = serializers.CharField(allow_null=True, help_text="null: the whole pool.")
    first_day = serializers.DateField()
    last_day = serializers.DateField()
    series = SeriesOut()
    capacity_gpus = serializers.FloatField(allow_null=True)
    target = serializers.FloatField(allow_null=True)
    saturation = SaturationOut(allow_null=True)
    drivers = DriverOut(many=True)
    options = OptionOut(many=True)
    tco = serializers.DictField(child=FigureOut())


class PoolTargetIn(StrictInputSerializer):
    flavor = serializers.PrimaryKeyRelatedField(queryset=ResourceFlavor.objects.all())
    target_utilization = FractionField()


class PoolTargetOut(serializers.ModelSerializer[PoolTarget]):
    flavor_name = serializers.CharField(source="flavor.name", read_only=True)
    target_utilization = DecimalStringField()

    class Meta:
        model = PoolTarget
        fields = ["flavor", "flavor_name", "target_utilization", "updated_at"]


class TcoInputsIn(StrictInputSerializer):
    flavor = serializers.PrimaryKeyRelatedField(queryset=ResourceFlavor.objects.all())
    purchase_price = DecimalStringField(help_text="One GPU's share of its server, bought.")
    depreciation_months = serializers.IntegerField(min_value=1, max_value=240)
    power_cooling_per_gpu_hour = DecimalStringField()
    hosting_support_per_month = DecimalStringField(help_text="Per GPU.")
    on_demand_per_gpu_hour = DecimalStringField()
    committed_per_gpu_hour = DecimalStringField()


class TcoInputsOut(serializers.ModelSerializer[TcoInputs]):
    flavor_name = serializers.CharField(source="flavor.name", read_only=True)
    purchase_price = DecimalStringField()
    power_cooling_per_gpu_hour = DecimalStringField()
    hosting_support_per_month = DecimalStringField()
    on_demand_per_gpu_hour = DecimalStringField()
    committed_per_gpu_hour = DecimalStringField()

    class Meta:
        model = TcoInputs
        fields = [
            "flavor",
            "flavor_name",
            *TCO_FIELDS,
            "updated_at",
        ]


class RateSuggestionIn(PoolTargetIn):
    """The model, and the utilization at which the suggested price recovers its cost."""


class RateSuggestionOut(serializers.ModelSerializer[RateSuggestion]):
    flavor_name = serializers.CharField(source="flavor.name", read_only=True)
    gpu_hour = DecimalStringField()
    target_utilization = DecimalStringField()
    created_by = serializers.CharField(source="created_by.username", default=None, allow_null=True)
    decided_by = serializers.CharField(source="decided_by.username", default=None, allow_null=True)

    class Meta:
        model = RateSuggestion
        fields = [
            "id",
            "flavor",
            "flavor_name",
            "gpu_hour",
            "target_utilization",
            "inputs",
            "explain",
            "state",
            "created_by",
            "created_at",
            "decided_by",
            "decided_at",
            "reason",
            "rate_card",
        ]


class AcceptIn(StrictInputSerializer):
    valid_from = serializers.DateTimeField(
        required=False, help_text="When the rate card starts; left out: the next month's start."
    )


class RejectIn(StrictInputSerializer):
    reason = serializers.CharField(
        min_length=1,
        max_length=500,
        error_messages={
            "required": "say why the suggestion is rejected.",
            "blank": "say why the suggestion is rejected.",
        },
    )


class ExpansionIn(StrictInputSerializer):
    flavor = serializers.CharField(min_length=1, max_length=63, help_text="The GPU model.")
    action = serializers.ChoiceField(["add", "remove", "move"])
    gpus = serializers.IntegerField(min_value=1, max_value=MAX_OPTION_GPUS)
    from_pool = serializers.RegexField(
        r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$",
        required=False,
        help_text="A move's node pool it takes the GPUs from.",
    )
    to_pool = serializers.RegexField(
        r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$",
        required=False,
        help_text="A move's node pool it gives them to.",
    )
    window_days = serializers.IntegerField(
        default=14, min_value=1, max_value=90, help_text="Days of real jobs replayed."
    )
    at_day = serializers.IntegerField(
        default=90,
        min_value=1,
        max_value=366,
        help_text="Replay the demand forecast this many days ahead.",
    )

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        pools = {k for k in ("from_pool", "to_pool") if k in attrs}
        if attrs["action"] == "move" and pools != {"from_pool", "to_pool"}:
            missing = sorted({"from_pool", "to_pool"} - pools)
            raise serializers.ValidationError(
                {str(k): ["a move names both pools."] for k in missing}
            )
        if attrs["action"] != "move" and pools:
            raise serializers.ValidationError({str(k): ["only a move names pools."] for k in pools})
        return attrs


class ExpansionOut(serializers.Serializer):
    whatif = serializers.IntegerField(help_text="The what-if run (GET /api/v1/what-ifs/{id}/).")
    demand_scale = serializers.FloatField(help_text="The window's jobs replayed this many times.")
    saturation = SaturationOut(help_text="The pool's saturation days with the change.")
