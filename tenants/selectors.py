"""Reads on the organisation, scoped to what the user may see."""

from __future__ import annotations

from typing import Any

from django.db.models import Q, QuerySet

from tenants import access
from tenants.models import PriorityDefault, Quota


def quota_list_visible(user: Any) -> QuerySet[Quota]:
    return access.visible_by_tenant(user, Quota.objects.select_related("tenant", "flavor"))


def priority_default_list_visible(user: Any) -> QuerySet[PriorityDefault]:
    """Platform-wide defaults (tenant null) plus those of the user's subtrees."""
    rows = PriorityDefault.objects.select_related("priority_class")
    grants = access.grants_for(user)
    if grants.sees_everything:
        return rows
    return rows.filter(Q(tenant__isnull=True) | grants.subtree_q(prefix="tenant__"))
