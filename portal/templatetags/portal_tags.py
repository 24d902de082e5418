"""Formatting filters and the navigation switches of the portal's base template."""

from __future__ import annotations

from datetime import datetime, timedelta
from fractions import Fraction
from typing import Any

from django import template
from django.utils import timezone
from django.utils.timesince import timesince

from tenants import access
from tenants.models import ROLE_RANK, Role

register = template.Library()


@register.filter
def gpus(milli: int | None) -> str:
    """16000 -> '16', 2500 -> '2.5' (milli-GPU as GPUs)."""
    if milli is None:
        return "—"
    return f"{milli / 1000:g}"


@register.filter
def duration(seconds: int | None) -> str:
    if not seconds:
        return "—"
    hours, rest = divmod(int(seconds), 3600)
    minutes = rest // 60
    return f"{hours}h {minutes:02d}m" if hours else f"{minutes}m"


@register.filter
def ago(when: datetime | None) -> str:
    """How long ago, for lists: "just now" under a minute (timesince alone says "0 minutes"),
    else Django's timesince with "ago": "1 minute ago", "2 hours, 5 minutes ago"."""
    if when is None:
        return "—"
    now = timezone.now()
    if now - when < timedelta(minutes=1):
        return "just now"
    return f"{timesince(when, now)} ago"


@register.filter
def hours(value: Fraction) -> str:
    """An exact quantity of hours as the cost API shows it: six places."""
    from billing.rates.rating import quantity

    return str(quantity(value))


@register.filter
def state_class(state: str) -> str:
    return f"badge badge-{state.replace('_', '-')}" if state else "badge"


@register.simple_tag
def portal_nav(user: Any) -> dict[str, Any]:
    """Which sections the navigation shows; the pages check access again themselves."""
    if not getattr(user, "is_authenticated", False):
        return {}
    grants = access.grants_for(user)
    best = max((ROLE_RANK[r] for r in grants.roles_by_path.values()), default=0)
    return {
        "approver": grants.platform_admin or best >= ROLE_RANK[Role.APPROVER],
        "admin": grants.platform_admin or best >= ROLE_RANK[Role.ADMIN],
        "tenants": grants.sees_everything or best > 0,
        "audit": grants.sees_everything or best >= ROLE_RANK[Role.ADMIN],
        "submit": access.may_submit_somewhere(user),
        "costs": access.may_see_costs(user),
        "finance": grants.finance,
        "platform_admin": grants.platform_admin,
        "cluster_dashboard": grants.sees_everything,
        # The dashboard of the highest tenant the user holds a role in (others from its page).
        "tenant_dashboard": _top_tenant_id(grants.roles_by_path),
    }


def _top_tenant_id(roles_by_path: dict[str, str]) -> int | None:
    """ "/1/4/" -> 4: the tenant of the shortest path (the highest in the tree)."""
    if not roles_by_path:
        return None
    path = min(roles_by_path, key=lambda p: (p.count("/"), p))
    return int(path.strip("/").split("/")[-1])
