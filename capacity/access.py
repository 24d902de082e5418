"""Who sees capacity planning, and what of it.

Platform admins and finance see every pool and subtree; a tenant admin (a department's or a
team's) sees the forecasts of the subtrees they administer, and nothing of the pools' other
tenants (no saturation date, no capacity: those are the pool's, built from everyone's demand).
Members and approvers without an admin role: 403. Planning inputs: the pools' targets are set
by platform admins; TCO inputs and rate suggestions by finance or platform admins, who also
accept a suggestion into a rate card (billing lets finance add a suggested price: finance owns
prices).
"""

from __future__ import annotations

from typing import Any

from django.core.exceptions import PermissionDenied

from tenants import access
from tenants.models import Role, Tenant


def admin_paths(user: Any) -> list[str]:
    grants = access.grants_for(user)
    return sorted(path for path, role in grants.roles_by_path.items() if role == Role.ADMIN)


def sees_pools(user: Any) -> bool:
    return access.grants_for(user).sees_everything


def require_capacity_viewer(user: Any) -> None:
    if not (sees_pools(user) or admin_paths(user)):
        raise PermissionDenied(
            "Capacity planning is for platform admins, finance and tenant admins."
        )


def subtree_roots(user: Any) -> list[Tenant]:
    """The tenants whose subtrees a tenant admin sees (the highest where several nest)."""
    paths = admin_paths(user)
    tops = [p for p in paths if not any(p != q and p.startswith(q) for q in paths)]
    return list(Tenant.objects.filter(path__in=tops).order_by("path"))


def require_planner(user: Any) -> None:
    """TCO inputs and rate suggestions: finance and platform admins."""
    access.require_books_keeper(user)


def is_platform_admin(user: Any) -> bool:
    return access.grants_for(user).platform_admin


def require_platform_admin(user: Any) -> None:
    access.require_platform_admin(user)


def require_capacity_planner_reader(user: Any) -> None:
    """Targets, TCO inputs and suggestions are read by platform admins and finance."""
    if not sees_pools(user):
        raise PermissionDenied("Only finance and platform admins see capacity planning's inputs.")
