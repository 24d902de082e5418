"""Writes on the organisation: tenants, projects, memberships, flavors, quotas, priorities.

Each service is keyword-only, checks the caller's rights through `tenants.access`, validates,
and writes in one transaction. Permission failures raise PermissionDenied (403), rule
failures django's ValidationError (400).
"""

from __future__ import annotations

from typing import Any

from django.core.exceptions import PermissionDenied, ValidationError
from django.db import transaction

from tenants import access
from tenants.models import (
    Membership,
    PriorityClass,
    PriorityDefault,
    Project,
    Quota,
    ResourceFlavor,
    Tenant,
)
from tenants.quota_rules import QuotaValues, validate_quota


def _full_clean(obj: Any, exclude: list[str] | None = None) -> None:
    obj.full_clean(exclude=exclude, validate_constraints=True)


# --- tenants -----------------------------------------------------------------------------


@transaction.atomic
def tenant_create(*, user: Any, parent: Tenant | None, slug: str, name: str, kind: str) -> Tenant:
    if parent is None:
        access.require_platform_admin(user)
    elif not access.can_manage_tenant(user, parent):
        raise PermissionDenied(f"You are not an admin of tenant '{parent.slug}'.")
    tenant = Tenant(parent=parent, slug=slug, name=name, kind=kind)
    _full_clean(tenant, exclude=["path", "depth"])
    tenant.save()
    tenant.path = f"{parent.path if parent else '/'}{tenant.pk}/"
    tenant.depth = parent.depth + 1 if parent else 0
    tenant.save(update_fields=["path", "depth"])
    return tenant


@transaction.atomic
def tenant_update(*, user: Any, tenant: Tenant, name: str | None = None) -> Tenant:
    if not access.can_manage_tenant(user, tenant):
        raise PermissionDenied(f"You are not an admin of tenant '{tenant.slug}'.")
    if name is not None:
        tenant.name = name
    _full_clean(tenant)
    tenant.save()
    return tenant


# --- projects ----------------------------------------------------------------------------


@transaction.atomic
def project_create(
    *, user: Any, tenant: Tenant, slug: str, name: str, namespace: str | None = None
) -> Project:
    if not access.can_manage_tenant(user, tenant):
        raise PermissionDenied(f"You are not an admin of tenant '{tenant.slug}'.")
    project = Project(tenant=tenant, slug=slug, name=name, namespace=namespace or f"{slug}")
    _full_clean(project)
    project.save()
    return project


@transaction.atomic
def project_update(*, user: Any, project: Project, name: str | None = None) -> Project:
    if not access.can_manage_tenant(user, project.tenant):
        raise PermissionDenied(f"You are not an admin of tenant '{project.tenant.slug}'.")
    if name is not None:
        project.name = name
    _full_clean(project)
    project.save()
    return project


# --- memberships -------------------------------------------------------------------------


@transaction.atomic
def membership_set(*, user: Any, tenant: Tenant, member: Any, role: str) -> Membership:
    if not access.can_manage_tenant(user, tenant):
        raise PermissionDenied(f"You are not an admin of tenant '{tenant.slug}'.")
    membership, _ = Membership.objects.select_for_update().get_or_create(
        user=member, tenant=tenant, defaults={"role": role}
    )
    membership.role = role
    _full_clean(membership)
    membership.save()
    access.forget_grants(member)
    return membership


@transaction.atomic
def membership_delete(*, user: Any, membership: Membership) -> None:
    if not access.can_manage_tenant(user, membership.tenant):
        raise PermissionDenied(f"You are not an admin of tenant '{membership.tenant.slug}'.")
    membership.delete()


# --- flavors and priority classes (platform-wide) -----------------------------------------


@transaction.atomic
def flavor_save(*, user: Any, flavor: ResourceFlavor) -> ResourceFlavor:
    access.require_platform_admin(user)
    _full_clean(flavor)
    flavor.save()
    return flavor


@transaction.atomic
def priority_class_save(*, user: Any, priority_class: PriorityClass) -> PriorityClass:
    access.require_platform_admin(user)
    _full_clean(priority_class)
    priority_class.save()
    return priority_class


@transaction.atomic
def priority_default_set(
    *, user: Any, tenant: Tenant | None, job_type: str, priority_class: PriorityClass
) -> PriorityDefault:
    if tenant is None:
        access.require_platform_admin(user)
    elif not access.can_manage_tenant(user, tenant):
        raise PermissionDenied(f"You are not an admin of tenant '{tenant.slug}'.")
    row = (
        PriorityDefault.objects.select_for_update().filter(tenant=tenant, job_type=job_type).first()
    )
    row = row or PriorityDefault(tenant=tenant, job_type=job_type)
    row.priority_class = priority_class
    _full_clean(row, exclude=["tenant"])
    row.save()
    return row


@transaction.atomic
def priority_default_delete(*, user: Any, row: PriorityDefault) -> None:
    if row.tenant is None:
        access.require_platform_admin(user)
    elif not access.can_manage_tenant(user, row.tenant):
        raise PermissionDenied(f"You are not an admin of tenant '{row.tenant.slug}'.")
    row.delete()


def priority_default_for(*, tenant: Tenant, job_type: str) -> PriorityClass | None:
    """The nearest ancestor's default for the job type, else the platform's."""
    ids = tenant.ancestor_ids()
    rows = {
        row.tenant_id: row.priority_class
        for row in PriorityDefault.objects.filter(job_type=job_type)
        .filter(tenant_id__in=ids)
        .select_related("priority_class")
    }
    for tenant_id in reversed(ids):
        if tenant_id in rows:
            return rows[tenant_id]
    row = (
        PriorityDefault.objects.filter(job_type=job_type, tenant__isnull=True)
        .select_related("priority_class")
        .first()
    )
    return row.priority_class if row else None


# --- quotas ------------------------------------------------------------------------------


@transaction.atomic
def quota_set(*, user: Any, tenant: Tenant, flavor: ResourceFlavor, values: QuotaValues) -> Quota:
    """Create or update the quota of `tenant` for `flavor` after checking the whole tree.

    Locks the parent's quota row (and this one) so concurrent changes to siblings serialise.
    """
    if not access.can_set_quota(user, tenant):
        raise PermissionDenied(
            f"Quotas of '{tenant.slug}' are set by admins of its parent or by platform admins."
        )
    parent_quota = None
    if tenant.parent_id is not None:
        parent_quota = (
            Quota.objects.select_for_update()
            .filter(tenant_id=tenant.parent_id, flavor=flavor)
            .first()
        )
    quota = Quota.objects.select_for_update().filter(tenant=tenant, flavor=flavor).first()
    validate_quota(tenant, flavor, values, parent_quota)
    quota = quota or Quota(tenant=tenant, flavor=flavor)
    quota.guaranteed_milli = values.guaranteed_milli
    quota.limit_milli = values.limit_milli
    quota.lend_limit_milli = values.lend_limit_milli
    quota.weight = values.weight  # type: ignore[assignment]
    quota.user_limit_milli = values.user_limit_milli
    quota.save()
    return quota


@transaction.atomic
def quota_delete(*, user: Any, quota: Quota) -> None:
    if not access.can_set_quota(user, quota.tenant):
        raise PermissionDenied(
            f"Quotas of '{quota.tenant.slug}' are set by admins of its parent "
            "or by platform admins."
        )
    children = Quota.objects.filter(tenant__parent=quota.tenant, flavor=quota.flavor)
    if children.filter(guaranteed_milli__gt=0).exists():
        raise ValidationError(
            f"'{quota.tenant.slug}' still guarantees {quota.flavor.name} to its children; "
            "remove their quotas first."
        )
    quota.delete()
