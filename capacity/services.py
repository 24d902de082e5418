"""Writes of capacity planning: pool targets, TCO inputs, rate-card suggestions and their
decisions. Keyword-only; validate, one transaction, audited (tenants/audit.py)."""

from __future__ import annotations

from datetime import datetime
from decimal import Decimal, InvalidOperation
from typing import Any

from django.conf import settings
from django.core.exceptions import ValidationError
from django.db import transaction
from django.utils import timezone

from billing.models import RateCard
from billing.periods import next_month
from billing.rates.cards import RatePrices, rate_card_add
from capacity import access
from capacity.models import PoolTarget, RateSuggestion, SuggestionState, TcoInputs
from capacity.tco import Costs, chargeback_rate
from common.errors import ConflictError
from tenants.audit import audit_record, audit_snapshot
from tenants.models import ResourceFlavor

TCO_FIELDS = (
    "purchase_price",
    "depreciation_months",
    "power_cooling_per_gpu_hour",
    "hosting_support_per_month",
    "on_demand_per_gpu_hour",
    "committed_per_gpu_hour",
)


def costs_of(inputs: TcoInputs) -> Costs:
    return Costs(
        purchase_price=float(inputs.purchase_price),
        depreciation_months=int(inputs.depreciation_months),
        power_cooling_per_gpu_hour=float(inputs.power_cooling_per_gpu_hour),
        hosting_support_per_month=float(inputs.hosting_support_per_month),
        on_demand_per_gpu_hour=float(inputs.on_demand_per_gpu_hour),
        committed_per_gpu_hour=float(inputs.committed_per_gpu_hour),
    )


def _audit(user: Any, action: str, target: Any, before: dict[str, Any] | None) -> None:
    """A platform-wide change (no tenant's): `before` as audit_snapshot took it."""
    audit_record(
        actor=user,
        action=action,
        tenant=None,
        target=target,
        before=before,
        after=audit_snapshot(target),
    )


def _fraction(value: Any, field: str) -> Decimal:
    try:
        fraction = Decimal(str(value))
    except InvalidOperation:
        raise ValidationError({field: ["must be a number."]}) from None
    if not Decimal(0) < fraction <= Decimal(1):
        raise ValidationError({field: [f"must be above 0 and at most 1 (0.8 = 80%), not {value}."]})
    return fraction.quantize(Decimal("0.001"))


@transaction.atomic
def pool_target_set(*, user: Any, flavor: ResourceFlavor, target_utilization: Any) -> PoolTarget:
    """Set the utilization `flavor`'s pool is full at. Platform admins only."""
    access.require_platform_admin(user)
    fraction = _fraction(target_utilization, "target_utilization")
    target = PoolTarget.objects.select_for_update().filter(flavor=flavor).first()
    before = audit_snapshot(target)
    target = target or PoolTarget(flavor=flavor)
    target.target_utilization = fraction
    target.save()
    _audit(user, "capacity.target.set", target, before)
    return target


@transaction.atomic
def tco_inputs_set(*, user: Any, flavor: ResourceFlavor, values: dict[str, Any]) -> TcoInputs:
    """Enter the cost of owning and renting one GPU of `flavor` (all of TCO_FIELDS)."""
    access.require_planner(user)
    inputs = TcoInputs.objects.select_for_update().filter(flavor=flavor).first()
    before = audit_snapshot(inputs)
    inputs = inputs or TcoInputs(flavor=flavor)
    for name in TCO_FIELDS:
        setattr(inputs, name, values[name])
    inputs.full_clean(validate_constraints=True)  # ValidationError names the field at fault
    inputs.save()
    _audit(user, "capacity.tco.set", inputs, before)
    return inputs


@transaction.atomic
def rate_suggestion_create(
    *, user: Any, flavor: ResourceFlavor, target_utilization: Any, now: datetime | None = None
) -> RateSuggestion:
    """Suggest the GPU-hour price that recovers owning `flavor` at the target utilization.
    A pending suggestion for the same model is replaced (rejected, saying so)."""
    access.require_planner(user)
    now = now or timezone.now()
    inputs = TcoInputs.objects.filter(flavor=flavor).first()
    if inputs is None:
        raise ValidationError({"flavor": [f"{flavor.name} has no TCO inputs: enter them first."]})
    target = _fraction(target_utilization, "target_utilization")
    figure = chargeback_rate(costs_of(inputs), float(target), settings.GANTRY_BILLING_CURRENCY)
    for old in RateSuggestion.objects.select_for_update().filter(
        flavor=flavor, state=SuggestionState.PENDING
    ):
        _decide(old, user=user, state=SuggestionState.REJECTED, reason="replaced", now=now)
    suggestion = RateSuggestion.objects.create(
        flavor=flavor,
        gpu_hour=Decimal(f"{figure.value:.4f}"),
        target_utilization=target,
        inputs={"tco": audit_snapshot(inputs, TCO_FIELDS), **figure.inputs},
        explain=figure.explain,
        created_by=user,
        created_at=now,
    )
    _audit(user, "capacity.rate_suggestion.create", suggestion, None)
    return suggestion


def _decide(
    suggestion: RateSuggestion, *, user: Any, state: str, reason: str, now: datetime
) -> None:
    before = audit_snapshot(suggestion)
    suggestion.state, suggestion.reason = state, reason[:500]
    suggestion.decided_by, suggestion.decided_at = user, now
    suggestion.save()
    _audit(user, f"capacity.rate_suggestion.{state}", suggestion, before)


def _prices_from(suggestion: RateSuggestion) -> RatePrices:
    """The suggested GPU-hour price; the rest (CPU, memory, discount, multipliers) as the
    model's open rate card has them, so that accepting changes the GPU price alone."""
    card = RateCard.objects.filter(
        flavor=suggestion.flavor, cluster__isnull=True, valid_to__isnull=True
    ).first()
    if card is None:
        return RatePrices(gpu_hour=suggestion.gpu_hour)
    return RatePrices(
        gpu_hour=suggestion.gpu_hour,
        cpu_core_hour=card.cpu_core_hour,
        memory_gib_hour=card.memory_gib_hour,
        borrowed_discount=card.borrowed_discount,
        multipliers={m.priority_class: m.multiplier for m in card.multipliers.all()},
    )


@transaction.atomic
def rate_suggestion_decide(
    *,
    user: Any,
    suggestion: RateSuggestion,
    accept: bool,
    reason: str = "",
    valid_from: datetime | None = None,
    now: datetime | None = None,
) -> RateSuggestion:
    """Accept (a rate card from `valid_from`, by default the next month's start, through
    billing's rate_card_add) or reject a pending suggestion."""
    access.require_planner(user)
    now = now or timezone.now()
    locked = RateSuggestion.objects.select_for_update().get(pk=suggestion.pk)
    if locked.state != SuggestionState.PENDING:
        raise ConflictError(f"This suggestion was {locked.state} already.")
    if accept:
        # A reviewed suggestion: billing lets finance add it as well as platform admins.
        locked.rate_card = rate_card_add(
            user=user,
            flavor=locked.flavor,
            valid_from=valid_from or next_month(now),
            prices=_prices_from(locked),
            suggested=True,
        )
    _decide(
        locked,
        user=user,
        state=SuggestionState.ACCEPTED if accept else SuggestionState.REJECTED,
        reason=reason,
        now=now,
    )
    return locked
