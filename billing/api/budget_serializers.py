"""Budgets API serializers: amounts travel as decimal strings, months as their first day."""

from __future__ import annotations

from datetime import UTC, date, datetime
from decimal import Decimal
from typing import Any

from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from billing.api.serializers import DecimalStringField
from billing.models import BudgetPolicy, BudgetUnit
from common.api.serializers import StrictInputSerializer
from tenants.api.serializers import VisibleTenantField


@extend_schema_field({"type": "string", "pattern": r"^\d{1,8}(\.\d{1,2})?$", "example": "1000.00"})
class LimitField(DecimalStringField):
    """A budget's limit: money or GPU-hours, to the cent (two places at most)."""

    def to_internal_value(self, data: Any) -> Decimal:
        value = super().to_internal_value(data)
        if -value.as_tuple().exponent > 2:  # type: ignore[operator]
            self.fail_decimal("must have at most 2 decimal places.")
        return value


@extend_schema_field({"type": "string", "format": "date", "example": "2031-02-01"})
class MonthField(serializers.DateField):
    """A month, written as its first day ("2031-02-01"): the month's first instant, UTC."""

    def to_internal_value(self, value: Any) -> datetime:
        day: date = super().to_internal_value(value)
        if day.day != 1:
            raise serializers.ValidationError(
                f"must be the first day of a month, such as {day:%Y-%m}-01."
            )
        return datetime(day.year, day.month, 1, tzinfo=UTC)

    def to_representation(self, value: Any) -> str:
        return f"{value.astimezone(UTC):%Y-%m-%d}"


class BudgetCreateIn(StrictInputSerializer):
    tenant = VisibleTenantField(help_text="The tenant whose subtree the budget covers.")
    month = MonthField()
    unit = serializers.ChoiceField(choices=BudgetUnit.choices, default=BudgetUnit.MONEY)
    limit = LimitField(help_text="In the installation's currency, or in GPU-hours.")
    policy = serializers.ChoiceField(
        choices=BudgetPolicy.choices,
        default=BudgetPolicy.NOTIFY,
        help_text="What happens to a new job that would take the budget past 100 %.",
    )


class BudgetUpdateIn(StrictInputSerializer):
    limit = LimitField(required=False)
    policy = serializers.ChoiceField(choices=BudgetPolicy.choices, required=False)


class BudgetFiguresOut(serializers.Serializer[Any]):
    spent = serializers.CharField(help_text="Metered this month by the subtree's jobs.")
    committed = serializers.CharField(help_text="What admitted jobs may still cost.")
    remaining = serializers.CharField(help_text="limit - spent - committed; may be negative.")
    percent = serializers.CharField(help_text="(spent + committed) / limit, in %.")


class BudgetItemOut(serializers.Serializer[Any]):
    id = serializers.IntegerField()
    tenant = serializers.IntegerField()
    tenant_slug = serializers.CharField()
    month = serializers.CharField(help_text="The month's first day.")
    unit = serializers.ChoiceField(choices=BudgetUnit.choices)
    currency = serializers.CharField(allow_null=True, help_text="Null for GPU-hours.")
    limit = serializers.CharField()
    policy = serializers.ChoiceField(choices=BudgetPolicy.choices)
    position = BudgetFiguresOut()
    set_at = serializers.IntegerField(
        allow_null=True,
        help_text="The tenant whose admins set it (the budget's or an ancestor); null: finance "
        "or a platform admin. Only they, or those above, change or delete it.",
    )
    set_by = serializers.CharField(allow_null=True, help_text="Who created it.")
    created_at = serializers.DateTimeField()
    updated_at = serializers.DateTimeField()
