"""The rate cards page: every card's version chain (per flavor, and per cluster or the
default card), and for finance and platform admins a form that adds a version.

Prices are platform-wide and read by everyone signed in, as `GET /api/v1/rate-cards/`. Adding
a version goes the API's way: the same serializer (`RateCardIn`) and service
(`billing.rates.cards.rate_card_add`, which checks the role and writes the audit entry); a
bad input is the page again, status 400, the form as posted with what was wrong.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from django.conf import settings
from django.contrib import messages
from django.core.exceptions import PermissionDenied, ValidationError
from django.db.models import Prefetch
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.views.decorators.http import require_http_methods

from billing.api.serializers import RateCardIn
from billing.models import RateCard, RateMultiplier
from portal.decorators import login_required
from portal.rate_card_form import RateCardForm
from tenants import access


@dataclass
class Chain:
    flavor: str
    cluster: str | None  # None: the default card
    versions: list[RateCard]


def chains() -> list[Chain]:
    """Every (flavor, cluster) chain, the default card first, each oldest version first."""
    cards = RateCard.objects.select_related("flavor", "cluster", "created_by").prefetch_related(
        Prefetch(
            "multipliers",
            queryset=RateMultiplier.objects.select_related("priority_class").order_by(
                "-priority_class__value"
            ),
        )
    )
    found: dict[tuple[str, str | None], Chain] = {}
    for card in cards.order_by("flavor__name", "cluster__name", "valid_from"):
        cluster = card.cluster.name if card.cluster else None
        key = (card.flavor.name, cluster)
        found.setdefault(key, Chain(card.flavor.name, cluster, [])).versions.append(card)
    return sorted(found.values(), key=lambda c: (c.flavor, c.cluster is not None, c.cluster or ""))


def may_edit(user: Any) -> bool:
    return access.grants_for(user).sees_everything  # finance and platform admins


@login_required
@require_http_methods(["GET", "POST"])
def rate_cards(request: HttpRequest) -> HttpResponse:
    editor = may_edit(request.user)
    form = RateCardForm(request.POST or None) if editor else None
    if request.method == "POST":
        if form is None:
            raise PermissionDenied("Only finance and platform admins add rate card versions.")
        if _add(request, form):
            return redirect("portal:rate-cards")
    context = {
        "chains": chains(),
        "form": form,
        "currency": settings.GANTRY_BILLING_CURRENCY,
    }
    status = 400 if form is not None and form.errors else 200
    return render(request, "portal/rate_cards/page.html", context, status=status)


def _add(request: HttpRequest, form: RateCardForm) -> bool:
    if not form.is_valid():
        return False
    body = RateCardIn(data=form.api_data())
    if not body.is_valid():
        form.add_errors(body.errors)
        return False
    try:
        card = body.add(request.user)
    except ValidationError as exc:
        form.add_errors(exc.message_dict if hasattr(exc, "error_dict") else {"": exc.messages})
        return False
    where = card.cluster.name if card.cluster else "the default card"
    messages.success(request, f"Version {card.pk} of {card.flavor.name} ({where}) added.")
    return True
