"""Input and output serializers of the billing API. Money travels as decimal strings."""

from __future__ import annotations

import re
from decimal import Decimal
from typing import Any

from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from billing.models import RateCard
from billing.rates import cards as rates
from common.api.serializers import StrictInputSerializer
from scheduler.models import Cluster
from tenants.models import PriorityClass, ResourceFlavor

DECIMAL = re.compile(r"\d{1,8}(\.\d{1,6})?")


@extend_schema_field({"type": "string", "pattern": r"^\d{1,8}(\.\d{1,6})?$", "example": "2.50"})
class DecimalStringField(serializers.Field):
    """A non-negative decimal written as a JSON string ("2.50"): a JSON number would pass
    through a binary float on the way in, and 0.1 is not 0.1 there."""

    def __init__(self, *, max_value: Decimal | None = None, **kwargs: Any) -> None:
        self.max_decimal = max_value
        super().__init__(**kwargs)

    def to_internal_value(self, data: Any) -> Decimal:
        if isinstance(data, bool) or not isinstance(data, str):
            self.fail_decimal('must be a decimal number in a string, such as "2.50".')
        text = data.strip()
        if text.startswith("-"):
            self.fail_decimal("must not be negative.")
        if not DECIMAL.fullmatch(text):
            self.fail_decimal(
                'must be a decimal number such as "2.50": digits, at most 8 before the point '
                "and 6 after it."
            )
        value = Decimal(text)
        if self.max_decimal is not None and value > self.max_decimal:
            self.fail_decimal(f"must be at most {self.max_decimal}.")
        return value

    def to_representation(self, value: Any) -> str:
        return str(value)

    @staticmethod
    def fail_decimal(message: str) -> None:
        raise serializers.ValidationError(message)


class RateCardIn(StrictInputSerializer):
    flavor = serializers.PrimaryKeyRelatedField(queryset=ResourceFlavor.objects.all())
    cluster = serializers.SlugRelatedField(
        slug_field="name",
        queryset=Cluster.objects.all(),
        required=False,
        allow_null=True,
        default=None,
        help_text="The cluster whose usage these prices rate, by name; left out or null: the "
        "default card, for every cluster without a card of its own.",
        error_messages={"does_not_exist": "no cluster named {value}."},
    )
    valid_from = serializers.DateTimeField(
        help_text="When the version takes effect; not before the time already metered."
    )
    valid_to = serializers.DateTimeField(
        required=False, allow_null=True, default=None, help_text="Left out: open-ended."
    )
    gpu_hour = DecimalStringField(help_text="Price of one whole device for an hour.")
    cpu_core_hour = DecimalStringField(required=False, default=Decimal(0))
    memory_gib_hour = DecimalStringField(required=False, default=Decimal(0))
    borrowed_discount = DecimalStringField(
        required=False,
        default=Decimal(0),
        max_value=Decimal(1),
        help_text="Fraction off the price of capacity borrowed beyond the guarantee (0.3).",
    )
    priority_multipliers = serializers.DictField(
        child=DecimalStringField(max_value=Decimal(100)),
        required=False,
        default=dict,
        help_text='Priority class name -> multiplier ("0.5"); a class left out costs x1.',
    )

    def add(self, user: Any) -> RateCard:
        """Add the version these validated fields describe, as ``user``, through
        ``rate_card_add`` (its checks and its audit): the API and the portal's form alike."""
        data = self.validated_data
        return rates.rate_card_add(
            user=user,
            flavor=data["flavor"],
            cluster=data["cluster"],
            valid_from=data["valid_from"],
            valid_to=data["valid_to"],
            prices=rates.RatePrices(
                gpu_hour=data["gpu_hour"],
                cpu_core_hour=data["cpu_core_hour"],
                memory_gib_hour=data["memory_gib_hour"],
                borrowed_discount=data["borrowed_discount"],
                multipliers=data["priority_multipliers"],
            ),
        )

    def validate_priority_multipliers(self, value: dict[str, Decimal]) -> dict[Any, Decimal]:
        classes = {pc.name: pc for pc in PriorityClass.objects.filter(name__in=list(value))}
        unknown = sorted(set(value) - set(classes))
        if unknown:
            raise serializers.ValidationError(
                f"unknown priority class(es): {', '.join(n[:63] for n in unknown[:10])}."
            )
        return {classes[name]: multiplier for name, multiplier in value.items()}


class RateCardOut(serializers.ModelSerializer):
    flavor_name = serializers.CharField(source="flavor.name", read_only=True)
    cluster = serializers.CharField(
        source="cluster.name",
        read_only=True,
        allow_null=True,
        default=None,
        help_text="null: the default card.",
    )
    gpu_hour = serializers.CharField(read_only=True)
    cpu_core_hour = serializers.CharField(read_only=True)
    memory_gib_hour = serializers.CharField(read_only=True)
    borrowed_discount = serializers.CharField(read_only=True)
    priority_multipliers = serializers.SerializerMethodField()

    class Meta:
        model = RateCard
        fields = [
            "id",
            "flavor",
            "flavor_name",
            "cluster",
            "valid_from",
            "valid_to",
            "currency",
            "gpu_hour",
            "cpu_core_hour",
            "memory_gib_hour",
            "borrowed_discount",
            "priority_multipliers",
            "created_at",
        ]

    @extend_schema_field(
        {"type": "object", "additionalProperties": {"type": "string"}, "example": {"low": "0.5"}}
    )
    def get_priority_multipliers(self, card: RateCard) -> dict[str, str]:
        return {m.priority_class.name: str(m.multiplier) for m in card.multipliers.all()}
