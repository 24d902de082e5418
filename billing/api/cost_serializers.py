"""Serializers of the cost and statement API: the query of a window, rows, statements, lines.

Money travels as decimal strings with two places, the currency beside it; GPU-hours as
decimal strings with six places (shown; the amounts come from the exact quantities)."""

from __future__ import annotations

from datetime import UTC, datetime
from fractions import Fraction
from typing import Any

from django.utils.dateparse import parse_date, parse_datetime
from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from billing.costs.lines import MAX_WINDOW
from billing.models import AdjustmentProposal, IdlePolicy, LineKind, Statement, StatementLine
from billing.periods import month_bounds, month_start, next_month
from billing.rates.rating import quantity
from billing.selectors import DIMENSIONS
from common.api.serializers import StrictInputSerializer


def hours(value: Fraction) -> str:
    return str(quantity(value))


@extend_schema_field({"type": "string", "example": "2031-01-01T00:00:00Z"})
class HourField(serializers.Field):
    """An ISO 8601 date (its midnight, UTC) or instant on a whole hour; without a zone, UTC.
    Usage is metered per hour, so a window is whole hours, as statements are."""

    def to_internal_value(self, data: Any) -> datetime:
        text = data.strip() if isinstance(data, str) else ""
        moment: datetime | None = None
        try:
            moment = parse_datetime(text)
            if moment is None and parse_date(text) is not None:
                day = parse_date(text)
                moment = datetime(day.year, day.month, day.day)  # type: ignore[union-attr]
        except ValueError:
            moment = None
        if moment is None:
            raise serializers.ValidationError(
                "an ISO 8601 date (2031-01-01) or instant (2031-01-01T00:00:00Z), "
                f"got {str(data)[:40]!r}."
            )
        moment = moment.replace(tzinfo=UTC) if moment.tzinfo is None else moment.astimezone(UTC)
        if (moment.minute, moment.second, moment.microsecond) != (0, 0, 0):
            raise serializers.ValidationError(
                "usage is metered per hour: give a whole hour (UTC), such as 2031-01-01T13:00Z."
            )
        return moment

    def to_representation(self, value: datetime) -> str:
        return value.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class WindowIn(serializers.Serializer):
    """[from, to): both left out, the current month (UTC); one left out, from the month of
    `to` or to the end of the month of `from`."""

    to = HourField(required=False, help_text="End of the window (exclusive).")

    def get_fields(self) -> dict[str, serializers.Field]:
        fields = super().get_fields()
        # "from" is a Python keyword: declared here, so the parameter keeps its name.
        fields["from"] = HourField(required=False, help_text="Start of the window (inclusive).")
        return fields

    def __init__(self, *args: Any, now: datetime | None = None, **kwargs: Any) -> None:
        self.now = now or datetime.now(UTC)
        super().__init__(*args, **kwargs)

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        start, end = attrs.get("from"), attrs.get("to")
        if start is None and end is None:
            start = month_start(self.now)
        if end is None:
            end = next_month(start)  # type: ignore[arg-type]
        if start is None:
            start = month_start(end - MAX_WINDOW.resolution)
        if end <= start:
            raise serializers.ValidationError({"to": ["must be after from."]})
        if end - start > MAX_WINDOW:
            raise serializers.ValidationError(
                {"to": [f"the window is at most {MAX_WINDOW.days} days; narrow from and to."]}
            )
        return {**attrs, "from": start, "to": end}


class CostQueryIn(WindowIn):
    by = serializers.ChoiceField(DIMENSIONS, default="team", help_text="Aggregate by this.")
    # Ids a database column holds: SQLite cannot bind a larger one (as common.api.filters).
    tenant = serializers.IntegerField(
        required=False,
        min_value=1,
        max_value=2**63 - 1,
        help_text="Only this tenant and its subtree.",
    )
    project = serializers.IntegerField(required=False, min_value=1, max_value=2**63 - 1)
    flavor = serializers.CharField(required=False, max_length=63)
    kind = serializers.ChoiceField(LineKind.choices, required=False)


class CostRowOut(serializers.Serializer):
    key = serializers.JSONField(
        allow_null=True,
        help_text="Id (department, team, project, user) or name (flavor, job type, priority "
        "class, cluster); null for costs that carry none (idle reserved capacity by project, "
        "adjustments by cluster...).",
    )
    name = serializers.CharField(allow_null=True)
    charged = serializers.CharField(help_text="Charged amount, a decimal string.")
    showback = serializers.CharField(help_text="Shown, not charged (idle capacity policy).")
    gpu_hours = serializers.CharField(help_text="Every line's GPU-hours, of every kind.")
    gpu_hours_used = serializers.CharField(
        help_text="GPU-hours jobs held (used, preempted, failed)"
    )
    gpu_hours_idle_reserved = serializers.CharField(
        help_text="GPU-hours of idle reserved capacity (charged or showback)."
    )

    def to_representation(self, row: Any) -> dict[str, Any]:
        return {
            "key": row.key,
            "name": row.name,
            "charged": str(row.charged),
            "showback": str(row.showback),
            **hour_figures(row),
        }


def hour_figures(row: Any) -> dict[str, str]:
    """A cost row's GPU-hour figures as the API shows them."""
    return {
        "gpu_hours": hours(row.gpu_hours),
        "gpu_hours_used": hours(row.gpu_hours_used),
        "gpu_hours_idle_reserved": hours(row.gpu_hours_idle_reserved),
    }


class CostTotalOut(serializers.Serializer):
    charged = serializers.CharField()
    showback = serializers.CharField()
    gpu_hours = serializers.CharField()
    gpu_hours_used = serializers.CharField()
    gpu_hours_idle_reserved = serializers.CharField()


class CostPageOut(serializers.Serializer):
    count = serializers.IntegerField()
    next = serializers.URLField(allow_null=True)
    previous = serializers.URLField(allow_null=True)
    currency = serializers.CharField()
    by = serializers.CharField()
    window = serializers.DictField(child=serializers.CharField())
    total = CostTotalOut()
    results = CostRowOut(many=True)


class StatementOut(serializers.ModelSerializer):
    organisation_slug = serializers.CharField(source="organisation.slug", read_only=True)
    closed_by = serializers.SerializerMethodField()

    class Meta:
        model = Statement
        fields = [
            "id",
            "organisation",
            "organisation_slug",
            "period_start",
            "period_end",
            "currency",
            "closed_at",
            "closed_by",
        ]

    @extend_schema_field({"type": "string", "nullable": True})
    def get_closed_by(self, statement: Statement) -> str | None:
        return statement.closed_by.username if statement.closed_by else None


class RollUpOut(serializers.Serializer):
    tenant = serializers.IntegerField()
    tenant_slug = serializers.CharField()
    parent_id = serializers.IntegerField(allow_null=True, help_text="The parent tenant.")
    charged = serializers.CharField()
    showback = serializers.CharField()


class StatementDetailOut(StatementOut):
    roll_up = RollUpOut(many=True, read_only=True, help_text="Totals per tenant node.")

    class Meta(StatementOut.Meta):
        fields = [*StatementOut.Meta.fields, "roll_up"]


class StatementLineOut(serializers.ModelSerializer):
    tenant_slug = serializers.CharField(source="tenant.slug", read_only=True)
    project_slug = serializers.CharField(source="project.slug", read_only=True, allow_null=True)
    username = serializers.CharField(source="user.username", read_only=True, allow_null=True)
    author = serializers.CharField(source="author.username", read_only=True, allow_null=True)
    quantity = serializers.CharField(read_only=True)
    rate = serializers.CharField(read_only=True)
    amount = serializers.CharField(read_only=True)

    class Meta:
        model = StatementLine
        fields = [
            "id",
            "tenant",
            "tenant_slug",
            "project",
            "project_slug",
            "user",
            "username",
            "flavor",
            "cluster",
            "resource",
            "kind",
            "unit",
            "quantity",
            "rate",
            "amount",
            "charged",
            "reason",
            "author",
            "created_at",
        ]
        extra_kwargs = {
            "cluster": {
                "help_text": "The cluster whose card priced the line, by name (issue 38): "
                "where its usage ran, or where its idle reserved capacity lies; '' for "
                "adjustments and lines of before clusters."
            }
        }


class StatementCloseIn(StrictInputSerializer):
    organisation = serializers.IntegerField(min_value=1)
    month = serializers.RegexField(
        r"^\d{4}-(0[1-9]|1[0-2])\Z",
        help_text="YYYY-MM (UTC).",
        error_messages={"invalid": "a month as YYYY-MM, such as 2031-01."},
    )

    def validate_month(self, value: str) -> str:
        try:
            month_bounds(value)
        except ValueError as exc:  # year 0000, or a month whose end is past year 9999
            raise serializers.ValidationError("a month from 0001-01 to 9999-11.") from exc
        return value


class StatementAdjustIn(StrictInputSerializer):
    tenant = serializers.IntegerField(min_value=1)
    project = serializers.IntegerField(min_value=1, required=False, allow_null=True)
    amount = serializers.RegexField(
        r"^-?\d{1,12}(\.\d{1,2})?\Z",
        help_text='A non-zero amount in cents as a string ("-12.50").',
        error_messages={"invalid": 'a decimal string in cents, such as "-12.50".'},
    )
    reason = serializers.CharField(max_length=500, help_text="Why: required.")


class AdjustmentProposalOut(serializers.ModelSerializer):
    job = serializers.IntegerField(source="allocation.job_id", read_only=True)
    amount = serializers.CharField(read_only=True)

    class Meta:
        model = AdjustmentProposal
        fields = [
            "id",
            "statement",
            "allocation",
            "job",
            "tenant",
            "project",
            "amount",
            "reason",
            "state",
            "created_at",
            "line",
        ]
        read_only_fields = fields


class ProposalAcceptIn(StrictInputSerializer):
    proposal = serializers.IntegerField(min_value=1, help_text="A pending proposal's id.")


class BillingPolicyOut(serializers.Serializer):
    organisation = serializers.IntegerField()
    organisation_slug = serializers.CharField()
    idle_policy = serializers.ChoiceField(IdlePolicy.choices)


class BillingPolicyIn(StrictInputSerializer):
    idle_policy = serializers.ChoiceField(IdlePolicy.choices)
