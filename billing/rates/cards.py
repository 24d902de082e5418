"""Writes on rate cards: add a version, withdraw a version not yet in force. Platform admins,
and finance for a price it reviewed as a rate suggestion (capacity's: finance owns prices).

The versions of a flavor form one chain without gaps or overlaps, appended at its end: a new
version starts where the last one ends, or closes the last one's open end at its start. A
version never starts before the metered time (`metered_until`): usage already metered keeps
the prices it was metered under, so a rate change is never retroactive.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

from django.conf import settings
from django.core.exceptions import ValidationError
from django.db import transaction
from django.utils import timezone

from billing.models import MeteringPeriod, RateCard, RateMultiplier
from scheduler.models import Cluster
from tenants import access
from tenants.audit import audit_record, audit_snapshot
from tenants.models import FormerFlavorName, PriorityClass, ResourceFlavor


@dataclass(frozen=True)
class RatePrices:
    gpu_hour: Decimal
    cpu_core_hour: Decimal = Decimal(0)
    memory_gib_hour: Decimal = Decimal(0)
    borrowed_discount: Decimal = Decimal(0)
    # priority class -> multiplier; classes left out cost x1.
    multipliers: dict[PriorityClass, Decimal] = field(default_factory=dict)


def flavor_renames() -> dict[str, str]:
    """Former flavor name -> the flavor's name now (tenants.FormerFlavorName). Usage, closed
    lines and allocations keep the name of their time; prices and cost reads follow the
    flavor, not its name."""
    return dict(FormerFlavorName.objects.values_list("name", "flavor__name"))


def metered_until() -> datetime | None:
    """The end of the last metered hour: time before it is priced for good."""
    last = MeteringPeriod.objects.order_by("-start").values_list("end", flat=True).first()
    return last


def _when(moment: datetime) -> str:
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def chain_of(flavor_id: int, cluster_id: int | None) -> Any:
    """The versions of one chain: the flavor's cards on `cluster_id` (null: its default)."""
    if cluster_id is None:
        return RateCard.objects.filter(flavor_id=flavor_id, cluster__isnull=True)
    return RateCard.objects.filter(flavor_id=flavor_id, cluster_id=cluster_id)


def _chain_name(flavor: ResourceFlavor, cluster: Cluster | None) -> str:
    return f"{flavor.name} on cluster {cluster.name}" if cluster else flavor.name


def _chain_errors(
    flavor: ResourceFlavor,
    cluster: Cluster | None,
    valid_from: datetime,
    valid_to: datetime | None,
) -> tuple[dict[str, list[str]], RateCard | None]:
    """Why [valid_from, valid_to) cannot join the chain of (flavor, cluster), and its last
    version."""
    errors: dict[str, list[str]] = {}
    # Rates change on the hour: a metered hour then has one price per flavor, which is what
    # lets the cluster's capacity split reconcile to the cent.
    for name, moment in (("valid_from", valid_from), ("valid_to", valid_to)):
        if moment is None:
            continue
        utc = moment.astimezone(UTC)
        if (utc.minute, utc.second, utc.microsecond) != (0, 0, 0):
            errors[name] = [f"{_when(moment)}: rates change on the hour (minutes and seconds 0)."]
    if errors:
        return errors, None
    if valid_to is not None and valid_to <= valid_from:
        errors["valid_to"] = [f"must be after valid_from ({_when(valid_from)})."]
    metered = metered_until()
    if metered is not None and valid_from < metered:
        errors["valid_from"] = [
            f"{_when(valid_from)} is before {_when(metered)}, up to which usage is metered "
            "already: a new rate applies from its start, never retroactively."
        ]
    last = chain_of(flavor.pk, cluster.pk if cluster else None).order_by("-valid_from").first()
    if last is None or "valid_from" in errors:
        return errors, last
    span = f"{_when(last.valid_from)} to {_when(last.valid_to) if last.valid_to else 'open end'}"
    if valid_from <= last.valid_from or (last.valid_to is not None and valid_from < last.valid_to):
        errors["valid_from"] = [
            f"overlaps version {last.pk} of {_chain_name(flavor, cluster)} ({span}); a new "
            f"version starts after {_when(last.valid_from)}"
            + (f", at {_when(last.valid_to)}." if last.valid_to else ".")
        ]
    elif last.valid_to is not None and valid_from > last.valid_to:
        errors["valid_from"] = [
            f"leaves a gap after version {last.pk} of {_chain_name(flavor, cluster)} ({span}): "
            f"the next version must start at {_when(last.valid_to)}."
        ]
    return errors, last


@transaction.atomic
def rate_card_add(
    *,
    user: Any,
    flavor: ResourceFlavor,
    valid_from: datetime,
    valid_to: datetime | None = None,
    prices: RatePrices,
    suggested: bool = False,
    cluster: Cluster | None = None,
) -> RateCard:
    """Append a version to the chain of (`flavor`, `cluster`): a cluster's own prices, or
    with `cluster` None the default card, which rates every cluster without a chain of its
    own (billing.rates.rating.chain_for). Appended (closing the open end of the last one at
    `valid_from`). ValidationError names the field at fault; nothing is written then.

    Finance and platform admins add versions: finance owns prices (the API, the portal's
    rate cards page, and a rate suggestion accepted in capacity planning, `suggested`, all
    come here). The audit entry names whoever added the version."""
    access.require_books_keeper(user)
    # One writer per flavor's chain at a time: two admins adding versions at once would each
    # see the same last version and both append.
    ResourceFlavor.objects.select_for_update().filter(pk=flavor.pk).first()
    errors, last = _chain_errors(flavor, cluster, valid_from, valid_to)
    if errors:
        raise ValidationError(errors)
    if last is not None and last.valid_to is None:
        before = _snapshot(last)
        last.valid_to = valid_from
        last.save(update_fields=["valid_to"])
        _audit(user, "rate_card.close", last, before)
    card = RateCard(
        flavor=flavor,
        cluster=cluster,
        valid_from=valid_from,
        valid_to=valid_to,
        currency=settings.GANTRY_BILLING_CURRENCY,
        gpu_hour=prices.gpu_hour,
        cpu_core_hour=prices.cpu_core_hour,
        memory_gib_hour=prices.memory_gib_hour,
        borrowed_discount=prices.borrowed_discount,
        created_by=user if getattr(user, "is_authenticated", False) else None,
    )
    card.full_clean(validate_constraints=True)
    card.save()
    RateMultiplier.objects.bulk_create(
        RateMultiplier(rate_card=card, priority_class=pc, multiplier=value)
        for pc, value in prices.multipliers.items()
    )
    _audit(user, "rate_card.add", card, None)
    return card


@transaction.atomic
def rate_card_withdraw(*, user: Any, rate_card: RateCard, now: datetime | None = None) -> None:
    """Delete the last version of a flavor before it takes effect; the previous version
    gets its end back. A version in force or already metered is part of the record."""
    access.require_platform_admin(user)
    now = now or timezone.now()
    ResourceFlavor.objects.select_for_update().filter(pk=rate_card.flavor_id).first()
    chain = chain_of(rate_card.flavor_id, rate_card.cluster_id)
    last = chain.order_by("-valid_from").first()
    if last is None or last.pk != rate_card.pk:
        raise ValidationError(
            {
                "non_field_errors": [
                    "only the last version of a flavor's chain (per cluster) can be withdrawn."
                ]
            }
        )
    metered = metered_until()
    if rate_card.valid_from <= now or (metered is not None and rate_card.valid_from < metered):
        raise ValidationError(
            {
                "non_field_errors": [
                    f"version {rate_card.pk} is in force since "
                    f"{_when(rate_card.valid_from)}; add a newer version instead."
                ]
            }
        )
    previous = chain.filter(valid_to=rate_card.valid_from).exclude(pk=rate_card.pk).first()
    before = _snapshot(rate_card)
    target = ("billing.ratecard", rate_card.pk)
    rate_card.delete()
    audit_record(
        actor=user,
        action="rate_card.withdraw",
        tenant=None,
        target=target,
        before=before,
        after=None,
    )
    if previous is not None:
        prior = _snapshot(previous)
        previous.valid_to = rate_card.valid_to
        previous.save(update_fields=["valid_to"])
        _audit(user, "rate_card.reopen", previous, prior)


def _snapshot(card: RateCard) -> Any:
    data = audit_snapshot(card)
    data["multipliers"] = {
        m.priority_class.name: f"{Decimal(m.multiplier):.4f}"
        for m in card.multipliers.select_related("priority_class")
    }
    for name in ("gpu_hour", "cpu_core_hour", "memory_gib_hour", "borrowed_discount"):
        # Exact and as the database keeps it, where audit_snapshot gives floats.
        places = RateCard._meta.get_field(name).decimal_places  # type: ignore[union-attr]
        data[name] = f"{Decimal(getattr(card, name)):.{places}f}"
    return data


def _audit(user: Any, action: str, card: RateCard, before: Any) -> None:
    audit_record(
        actor=user, action=action, tenant=None, target=card, before=before, after=_snapshot(card)
    )
