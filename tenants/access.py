"""Who may see or do what. Every view and API endpoint gets objects through these functions.

Rules:
- A role on a tenant holds for its whole subtree. Visibility needs any role (member and up).
- Platform admins see and change everything; finance sees everything and changes nothing.
- An object the user cannot see is a 404 (`Http404`), never a 403, so that ids of other
  tenants' objects reveal nothing. A visible object the user may not change is a 403.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from django.core.exceptions import PermissionDenied
from django.db.models import Q, QuerySet
from django.http import Http404

from tenants.models import (
    ROLE_RANK,
    Membership,
    PlatformRoleName,
    Project,
    Role,
    Tenant,
)


@dataclass
class Grants:
    """The access of one user, computed once per request and cached on the user object."""

    platform_admin: bool = False
    finance: bool = False
    # tenant path -> best role held there (the role covers the subtree under that path)
    roles_by_path: dict[str, str] = field(default_factory=dict)

    @property
    def sees_everything(self) -> bool:
        return self.platform_admin or self.finance

    def subtree_q(self, min_role: str = Role.MEMBER, prefix: str = "") -> Q:
        """A Q matching tenants (through `prefix`, e.g. "tenant__") in granted subtrees."""
        paths = [p for p, r in self.roles_by_path.items() if ROLE_RANK[r] >= ROLE_RANK[min_role]]
        if not paths:
            return Q(pk__in=[])
        query = Q()
        for path in paths:
            query |= Q(**{f"{prefix}path__startswith": path})
        return query

    def role_on(self, tenant: Tenant) -> str | None:
        """The highest role the user holds on `tenant` through it or any ancestor."""
        best: str | None = None
        for path, role in self.roles_by_path.items():
            if tenant.path.startswith(path) and (best is None or ROLE_RANK[role] > ROLE_RANK[best]):
                best = role
        return best


def grants_for(user: Any) -> Grants:
    cached = getattr(user, "_gantry_grants", None)
    if cached is not None:
        return cached
    grants = Grants()
    if user is not None and user.is_authenticated and user.is_active:
        roles = set(user.platform_roles.values_list("role", flat=True))
        grants.platform_admin = PlatformRoleName.PLATFORM_ADMIN in roles or user.is_superuser
        grants.finance = PlatformRoleName.FINANCE in roles
        for path, role in Membership.objects.filter(user=user).values_list("tenant__path", "role"):
            current = grants.roles_by_path.get(path)
            if current is None or ROLE_RANK[role] > ROLE_RANK[current]:
                grants.roles_by_path[path] = role
    user._gantry_grants = grants
    return grants


def forget_grants(user: Any) -> None:
    """Drop the cached grants after the user's roles changed."""
    if hasattr(user, "_gantry_grants"):
        del user._gantry_grants


# --- tenants -----------------------------------------------------------------------------


def tenants_visible(user: Any) -> QuerySet[Tenant]:
    grants = grants_for(user)
    if grants.sees_everything:
        return Tenant.objects.all()
    return Tenant.objects.filter(grants.subtree_q())


def tenant_ids_visible(user: Any) -> list[int]:
    return list(tenants_visible(user).values_list("id", flat=True))


def can_manage_tenant(user: Any, tenant: Tenant) -> bool:
    """Admins of the tenant or of an ancestor manage it (members, projects, defaults)."""
    grants = grants_for(user)
    return grants.platform_admin or grants.role_on(tenant) == Role.ADMIN


def can_set_quota(user: Any, tenant: Tenant) -> bool:
    """Quotas are set from above: an admin of a strict ancestor, or a platform admin.

    A team admin cannot raise their own team's quota; they ask (a quota request) instead.
    """
    grants = grants_for(user)
    if grants.platform_admin:
        return True
    return tenant.parent_id is not None and any(
        tenant.path.startswith(path) and path != tenant.path and role == Role.ADMIN
        for path, role in grants.roles_by_path.items()
    )


# --- rules set from above: budgets, approval (and cost) policies, idle rules ---------------
#
# A rule on a tenant records where it was set from (`set_at`): the tenant whose admins set it
# (the highest of the tenant's chain, itself included, where the writer is an admin), or None
# for platform admins (and finance, for budgets). It is changed or removed only from there or
# above, so a team admin may add rules of their own on their team but never loosen or remove
# one set from above; every rule of every level applies (budgets, approval policies), and an
# idle rule of a team's own may only be stricter (tenants/idle_rules.py).


def rule_origin(user: Any, tenant: Tenant, *, finance: bool = False) -> Tenant | None:
    """Where a rule `user` writes on `tenant` is set from: None for platform admins (and for
    finance where `finance`), else the highest tenant of `tenant`'s chain (itself included)
    that `user` is an admin of. PermissionDenied when they administer none of it."""
    grants = grants_for(user)
    if grants.platform_admin or (finance and grants.finance):
        return None
    paths = [
        path
        for path, role in grants.roles_by_path.items()
        if role == Role.ADMIN and tenant.path.startswith(path)
    ]
    if not paths:
        raise PermissionDenied(f"You are not an admin of tenant '{tenant.slug}'.")
    highest = min(paths, key=len)
    return Tenant.objects.get(pk=int(highest.strip("/").split("/")[-1]))


def can_write_rule(user: Any, set_at: Tenant | None, *, finance: bool = False) -> bool:
    """Whether `user` may change or remove a rule set from `set_at` (None: by a platform
    admin or finance): platform admins (and finance where `finance`) always; others when
    they are admins of `set_at` or of a tenant above it."""
    grants = grants_for(user)
    if grants.platform_admin or (finance and grants.finance):
        return True
    return set_at is not None and grants.role_on(set_at) == Role.ADMIN


def set_from_text(set_at: Tenant | None, *, finance: bool = False) -> str:
    """'team-alpha's admins' or 'finance or a platform admin', for messages."""
    if set_at is None:
        return "finance or a platform admin" if finance else "a platform admin"
    return f"the admins of '{set_at.slug}'"


def require_write_rule(
    user: Any, set_at: Tenant | None, what: str, *, finance: bool = False
) -> None:
    """PermissionDenied (403) unless `user` may change or remove `what`, set from `set_at`."""
    if not can_write_rule(user, set_at, finance=finance):
        raise PermissionDenied(
            f"{what} was set by {set_from_text(set_at, finance=finance)}: only they (or those "
            "above them) may change or remove it. You may add a stricter rule of your own."
        )


def access_tenant(user: Any, tenant_id: Any, *, manage: bool = False) -> Tenant:
    tenant = _get_or_404(tenants_visible(user), tenant_id)
    if manage and not can_manage_tenant(user, tenant):
        raise PermissionDenied(f"You are not an admin of tenant '{tenant.slug}'.")
    return tenant


# --- projects ----------------------------------------------------------------------------


def projects_visible(user: Any) -> QuerySet[Project]:
    grants = grants_for(user)
    if grants.sees_everything:
        return Project.objects.all()
    return Project.objects.filter(grants.subtree_q(prefix="tenant__"))


def access_project(user: Any, project_id: Any, *, submit: bool = False) -> Project:
    project = _get_or_404(projects_visible(user).select_related("tenant"), project_id)
    if submit and not can_submit(user, project):
        raise PermissionDenied(f"You may not submit jobs to project '{project.slug}'.")
    return project


def can_submit(user: Any, project: Project) -> bool:
    """Members (and up) of the project's team submit; finance alone does not."""
    grants = grants_for(user)
    return grants.platform_admin or grants.role_on(project.tenant) is not None


def may_submit_somewhere(user: Any) -> bool:
    """Whether a "Submit a job" button is shown: `can_submit`'s rule without a project
    (a role on some team, or platform admin); finance alone may not."""
    grants = grants_for(user)
    return grants.platform_admin or bool(grants.roles_by_path)


def may_see_costs(user: Any) -> bool:
    """The Costs page: finance and platform admins (everything), tenant admins (their
    subtrees)."""
    grants = grants_for(user)
    return grants.sees_everything or Role.ADMIN in grants.roles_by_path.values()


# --- helpers -----------------------------------------------------------------------------


def visible_by_tenant(
    user: Any, queryset: QuerySet[Any], prefix: str = "tenant__"
) -> QuerySet[Any]:
    """Filter any queryset whose rows hang off a tenant to the user's subtrees."""
    grants = grants_for(user)
    if grants.sees_everything:
        return queryset
    return queryset.filter(grants.subtree_q(prefix=prefix))


def require_platform_admin(user: Any) -> None:
    if not grants_for(user).platform_admin:
        raise PermissionDenied("Only platform admins may do this.")


def require_books_keeper(user: Any) -> None:
    """Closing a month's statements and correcting them is finance's work, and platform
    admins'; finance changes nothing else."""
    if not grants_for(user).sees_everything:
        raise PermissionDenied("Only finance and platform admins may do this.")


def _get_or_404(queryset: QuerySet[Any], pk: Any) -> Any:
    try:
        return queryset.get(pk=int(pk))
    except (ValueError, TypeError, queryset.model.DoesNotExist):
        raise Http404("Not found.") from None
