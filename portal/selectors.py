"""Reads the portal composes from other apps' selectors: quota use per tenant and flavor.

Everything here starts from querysets already scoped by `tenants.access`, so a caller cannot
widen what a user sees by passing other ids.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from typing import Any

from django.apps import apps
from django.contrib.auth import get_user_model
from django.core.exceptions import FieldDoesNotExist
from django.db.models import Count, Q, QuerySet
from django.http import Http404

from scheduler.jobs.selectors import job_list_visible
from scheduler.models import Job, JobState
from tenants import access
from tenants.models import (
    AuditEntry,
    Membership,
    PriorityDefault,
    Role,
    Tenant,
)


def teams_of(user: Any) -> list[Tenant]:
    """The tenants the user holds a role on directly (their teams), tree order."""
    ids = Membership.objects.filter(user=user).values_list("tenant_id", flat=True)
    return list(access.tenants_visible(user).filter(pk__in=ids).order_by("path"))


def tenants_administered(user: Any) -> list[Tenant]:
    """The subtrees where the user is an admin (everything for a platform admin)."""
    grants = access.grants_for(user)
    tenants = access.tenants_visible(user)
    if not grants.platform_admin:
        tenants = tenants.filter(grants.subtree_q(min_role=Role.ADMIN))
    return list(tenants.order_by("path"))


def priority_defaults_by_tenant(tenants: list[Tenant]) -> dict[int, dict[str, str]]:
    """tenant id -> job type -> the class name a job without one gets (nearest ancestor's
    row, else the platform's), like `priority_default_for` but in one query for all."""
    ancestor_ids = {pk for t in tenants for pk in t.ancestor_ids()}
    rows = PriorityDefault.objects.filter(
        Q(tenant__isnull=True) | Q(tenant_id__in=ancestor_ids)
    ).values_list("tenant_id", "job_type", "priority_class__name")
    by_tenant: dict[int | None, dict[str, str]] = defaultdict(dict)
    for tenant_id, job_type, name in rows:
        by_tenant[tenant_id][job_type] = name
    out: dict[int, dict[str, str]] = {}
    for tenant in tenants:
        resolved = dict(by_tenant[None])
        for pk in tenant.ancestor_ids():  # root first, so nearer rows win
            resolved.update(by_tenant.get(pk, {}))
        out[tenant.pk] = resolved
    return out


def membership_list_of(tenant: Tenant) -> QuerySet[Membership]:
    """Memberships held on `tenant` itself (the caller has access-checked the tenant)."""
    return (
        Membership.objects.filter(tenant=tenant).select_related("user").order_by("user__username")
    )


def access_membership(tenant: Tenant, membership_pk: int) -> Membership:
    """A membership of `tenant` (already access-checked), else 404: an id from another
    tenant, even one the user can see, does not resolve through this tenant's URL."""
    try:
        return membership_list_of(tenant).select_related("tenant").get(pk=membership_pk)
    except Membership.DoesNotExist:
        raise Http404("Not found.") from None


def user_by_username(username: str) -> Any:
    return get_user_model().objects.filter(username=username).first()


def job_state_counts(jobs: QuerySet[Job]) -> dict[str, int]:
    """Jobs per state, keyed by the state's label as a person reads it ("Pending approval")."""
    counts = dict(jobs.order_by().values_list("state").annotate(n=Count("id")))
    return {str(state.label).capitalize(): counts.get(state, 0) for state in JobState}


def my_recent_jobs(user: Any, limit: int = 8) -> list[Job]:
    return list(job_list_visible(user).filter(submitted_by=user)[:limit])


def audit_reference_names(entries: Iterable[AuditEntry]) -> dict[int, dict[tuple[str, Any], str]]:
    """entry id -> (field, id) -> the name of what the field refers to, for the references
    (foreign keys of the entry's target model) in the entries' before and after: one query
    per referenced model for the whole page. A reference to a deleted row has no name."""
    wanted: dict[Any, set[Any]] = defaultdict(set)
    refs: list[tuple[int, str, Any, Any]] = []  # entry id, field, related model, id
    for entry in entries:
        model = _audited_model(entry.target_type)
        for side in (entry.before, entry.after) if model is not None else ():
            for key, value in (side if isinstance(side, dict) else {}).items():
                related = _related_model(model, key)
                if related is not None and isinstance(value, int | str):
                    refs.append((entry.pk, key, related, value))
                    wanted[related].add(value)
    found = {
        related: {obj.pk: str(obj) for obj in related._default_manager.filter(pk__in=ids)}
        for related, ids in wanted.items()
    }
    out: dict[int, dict[tuple[str, Any], str]] = defaultdict(dict)
    for entry_id, key, related, value in refs:
        name = found[related].get(value)
        if name is not None:
            out[entry_id][(key, value)] = name
    return out


def _audited_model(label: str) -> Any:
    try:
        return apps.get_model(label)
    except (LookupError, ValueError):
        return None


def _related_model(model: Any, name: str) -> Any:
    try:
        field = model._meta.get_field(name)
    except FieldDoesNotExist:
        return None
    return field.related_model if field.many_to_one or field.one_to_one else None
