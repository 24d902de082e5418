"""Writes on the organisation: tenants, projects, memberships, flavors, quotas, priorities.

Each service is keyword-only, checks the caller's rights through `tenants.access`, validates,
and writes in one transaction. Permission failures raise PermissionDenied (403), rule
failures django's ValidationError (400).
"""

from __future__ import annotations

from typing import Any

from django.contrib.auth import get_user_model
from django.core.exceptions import PermissionDenied, ValidationError
from django.db import transaction

from common.db.shared_reads import shared
from common.text import is_system_namespace
from tenants import access, webhooks
from tenants.audit import audit_record, audit_snapshot
from tenants.models import (
    FormerFlavorName,
    Membership,
    Notification,
    PriorityClass,
    PriorityDefault,
    Project,
    Quota,
    ResourceFlavor,
    Tenant,
)
from tenants.outbox import notifications_add, redact_url, webhook_test_event
from tenants.quotas.changes import QuotaChange, change_of, values_with
from tenants.quotas.pins import (
    check_global_holds_childrens_pins,
    check_global_holds_pins,
    validate_pinned,
)
from tenants.quotas.rules import QuotaValues, validate_quota


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
    audit_record(
        actor=user,
        action="tenant.create",
        tenant=tenant,
        target=tenant,
        before=None,
        after=audit_snapshot(tenant),
    )
    return tenant


@transaction.atomic
def tenant_update(
    *, user: Any, tenant: Tenant, name: str | None = None, webhook_url: str | None = None
) -> Tenant:
    """Rename the tenant, or set (empty: remove) the https webhook its notifications go to,
    which must be a public host (tenants/webhooks.py). A webhook set where there was none gets
    a signing secret: `tenant.webhook_secret_new` holds it for this answer alone (None when
    none was made)."""
    if not access.can_manage_tenant(user, tenant):
        raise PermissionDenied(f"You are not an admin of tenant '{tenant.slug}'.")
    before = _tenant_audited(tenant)
    if name is not None:
        tenant.name = name
    if webhook_url is not None:
        tenant.webhook_url = webhook_url
    _full_clean(tenant)
    if webhook_url:
        try:
            webhooks.url_check(webhook_url)
        except webhooks.WebhookRefused as refused:
            raise ValidationError({"webhook_url": [str(refused)]}) from None
    # A webhook gets its signing secret when it is set, and loses it when removed; a new URL
    # keeps the secret its receiver already verifies with.
    tenant.webhook_secret_new = None
    if not tenant.webhook_url:
        tenant.webhook_secret = ""
    elif not tenant.webhook_secret:
        tenant.webhook_secret = tenant.webhook_secret_new = webhooks.secret_new()
    tenant.save()
    audit_record(
        actor=user,
        action="tenant.update",
        tenant=tenant,
        target=tenant,
        before=before,
        after=_tenant_audited(tenant),
    )
    return tenant


def _tenant_audited(tenant: Tenant) -> Any:
    """The tenant as audited: its webhook's secret path left out (the log is read by every
    admin up the tree, and by auditors), so an entry says that it changed, not to what."""
    snapshot = audit_snapshot(tenant)
    snapshot["webhook_url"] = redact_url(tenant.webhook_url)
    return snapshot


@transaction.atomic
def webhook_secret_rotate(*, user: Any, tenant: Tenant) -> str:
    """Replace the tenant's webhook signing secret; the new one is returned this once. The
    old one stops signing at once (rotate the receiver's copy right after)."""
    if not access.can_manage_tenant(user, tenant):
        raise PermissionDenied(f"You are not an admin of tenant '{tenant.slug}'.")
    if not tenant.webhook_url:
        raise ValidationError({"webhook_url": ["This tenant has no webhook to sign for."]})
    tenant.webhook_secret = webhooks.secret_new()
    tenant.save(update_fields=["webhook_secret", "updated_at"])
    audit_record(
        actor=user,
        action="tenant.webhook_secret_rotate",
        tenant=tenant,
        target=tenant,
        before=None,
        after={"webhook_url": redact_url(tenant.webhook_url)},
    )
    return tenant.webhook_secret


@transaction.atomic
def webhook_test_send(*, user: Any, tenant: Tenant) -> Notification:
    """Queue a test message to the tenant's own webhook (delivered by the outbox, never in
    the request): its admins see the result in the webhook's health."""
    if not access.can_manage_tenant(user, tenant):
        raise PermissionDenied(f"You are not an admin of tenant '{tenant.slug}'.")
    if not tenant.webhook_url:
        raise ValidationError({"webhook_url": ["This tenant has no webhook to test."]})
    (row,) = notifications_add([webhook_test_event(tenant, user.get_username())])
    audit_record(
        actor=user,
        action="tenant.webhook_test",
        tenant=tenant,
        target=tenant,
        before=None,
        after={"notification": row.pk, "webhook_url": redact_url(tenant.webhook_url)},
    )
    return row


# --- projects ----------------------------------------------------------------------------


@transaction.atomic
def project_create(
    *, user: Any, tenant: Tenant, slug: str, name: str, namespace: str | None = None
) -> Project:
    """A project and its Kubernetes namespace, named after the slug, which the daemon creates
    and labels as Gantry's. Only a platform admin names a namespace (an existing one, assigned
    explicitly): a team admin who could would run the team's jobs in another group's namespace.
    """
    if not access.can_manage_tenant(user, tenant):
        raise PermissionDenied(f"You are not an admin of tenant '{tenant.slug}'.")
    if namespace is not None and not access.grants_for(user).platform_admin:
        raise PermissionDenied(
            "Only platform admins assign a namespace to a project; leave it out and Gantry "
            "creates the project's own namespace, named after its slug."
        )
    named = namespace is not None
    namespace = namespace or slug
    if is_system_namespace(namespace):
        if named:
            raise ValidationError({"namespace": [f"{namespace!r} is a system namespace."]})
        raise ValidationError(
            {"slug": [f"{slug!r} names a system namespace (a project's is named after its slug)."]}
        )
    project = Project(tenant=tenant, slug=slug, name=name, namespace=namespace)
    try:
        _full_clean(project)
    except ValidationError as invalid:
        raise _namespace_as_slug(invalid, slug) if not named else invalid from None
    project.save()
    audit_record(
        actor=user,
        action="project.create",
        tenant=tenant,
        target=project,
        before=None,
        after=audit_snapshot(project),
    )
    return project


def _namespace_as_slug(invalid: ValidationError, slug: str) -> ValidationError:
    """A namespace the caller did not name is the slug's: its errors are the slug's, said so
    (the caller sent no `namespace`, and an error on it would name a field they never saw)."""
    errors = dict(invalid.message_dict)
    if "namespace" not in errors:
        return invalid
    errors.pop("namespace")
    errors.setdefault("slug", []).append(
        f"{slug!r} is taken: a project's Kubernetes namespace is named after its slug, and "
        "another project has that namespace."
    )
    return ValidationError(errors)


@transaction.atomic
def project_update(*, user: Any, project: Project, name: str | None = None) -> Project:
    if not access.can_manage_tenant(user, project.tenant):
        raise PermissionDenied(f"You are not an admin of tenant '{project.tenant.slug}'.")
    before = audit_snapshot(project)
    if name is not None:
        project.name = name
    _full_clean(project)
    project.save()
    audit_record(
        actor=user,
        action="project.update",
        tenant=project.tenant,
        target=project,
        before=before,
        after=audit_snapshot(project),
    )
    return project


# --- memberships -------------------------------------------------------------------------


def membership_add(*, user: Any, tenant: Tenant, username: str, role: str) -> Membership:
    """Give the user named `username` a role on `tenant`. The name is looked up only once the
    caller may manage the tenant, so nobody else learns which usernames exist."""
    if not access.can_manage_tenant(user, tenant):
        raise PermissionDenied(f"You are not an admin of tenant '{tenant.slug}'.")
    member = get_user_model().objects.filter(username=username, is_active=True).first()
    if member is None:
        raise ValidationError({"username": [f"no active user named {username[:64]!r}."]})
    return membership_set(user=user, tenant=tenant, member=member, role=role)


@transaction.atomic
def membership_set(*, user: Any, tenant: Tenant, member: Any, role: str) -> Membership:
    if not access.can_manage_tenant(user, tenant):
        raise PermissionDenied(f"You are not an admin of tenant '{tenant.slug}'.")
    membership, created = Membership.objects.select_for_update().get_or_create(
        user=member, tenant=tenant, defaults={"role": role}
    )
    before = None if created else audit_snapshot(membership)
    membership.role = role
    _full_clean(membership)
    membership.save()
    audit_record(
        actor=user,
        action="membership.set",
        tenant=tenant,
        target=membership,
        before=before,
        after=audit_snapshot(membership),
    )
    access.forget_grants(member)
    return membership


@transaction.atomic
def membership_delete(*, user: Any, membership: Membership) -> None:
    if not access.can_manage_tenant(user, membership.tenant):
        raise PermissionDenied(f"You are not an admin of tenant '{membership.tenant.slug}'.")
    before, target = audit_snapshot(membership), ("tenants.membership", membership.pk)
    membership.delete()
    audit_record(
        actor=user,
        action="membership.delete",
        tenant=membership.tenant,
        target=target,
        before=before,
        after=None,
    )


# --- flavors and priority classes (platform-wide) -----------------------------------------


def _platform_object_save(*, user: Any, obj: Any, action: str) -> Any:
    """Validate and save a platform-wide object (platform admins only), audited."""
    access.require_platform_admin(user)
    before = None
    if obj.pk:
        before = audit_snapshot(type(obj).objects.filter(pk=obj.pk).first())
    _full_clean(obj)
    obj.save()
    audit_record(
        actor=user,
        action=action,
        tenant=None,
        target=obj,
        before=before,
        after=audit_snapshot(obj),
    )
    return obj


@transaction.atomic
def flavor_save(*, user: Any, flavor: ResourceFlavor) -> ResourceFlavor:
    """Create or change a flavor. A rename keeps the old name as the flavor's former name
    (`FormerFlavorName`): what was recorded under it stays the flavor's; no other flavor
    may take it."""
    before = (
        ResourceFlavor.objects.filter(pk=flavor.pk).values_list("name", flat=True).first()
        if flavor.pk
        else None
    )
    taken = FormerFlavorName.objects.filter(name=flavor.name).exclude(flavor_id=flavor.pk)
    if taken.exists():
        raise ValidationError(
            {"name": ["a former name of another flavor: what was recorded under it is that one's."]}
        )
    saved = _platform_object_save(user=user, obj=flavor, action="flavor.save")
    if before is not None and before != saved.name:
        FormerFlavorName.objects.update_or_create(name=before, defaults={"flavor": saved})
        FormerFlavorName.objects.filter(name=saved.name, flavor=saved).delete()
    return saved


@transaction.atomic
def priority_class_save(*, user: Any, priority_class: PriorityClass) -> PriorityClass:
    return _platform_object_save(user=user, obj=priority_class, action="priority_class.save")


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
    before = audit_snapshot(row)
    row = row or PriorityDefault(tenant=tenant, job_type=job_type)
    row.priority_class = priority_class
    _full_clean(row, exclude=["tenant"])
    row.save()
    audit_record(
        actor=user,
        action="priority_default.set",
        tenant=tenant,
        target=row,
        before=before,
        after=audit_snapshot(row),
    )
    return row


@transaction.atomic
def priority_default_delete(*, user: Any, row: PriorityDefault) -> None:
    if row.tenant is None:
        access.require_platform_admin(user)
    elif not access.can_manage_tenant(user, row.tenant):
        raise PermissionDenied(f"You are not an admin of tenant '{row.tenant.slug}'.")
    before, target = audit_snapshot(row), ("tenants.prioritydefault", row.pk)
    row.delete()
    audit_record(
        actor=user,
        action="priority_default.delete",
        tenant=row.tenant,
        target=target,
        before=before,
        after=None,
    )


@shared
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
def quota_set(
    *,
    user: Any,
    tenant: Tenant,
    flavor: ResourceFlavor,
    values: QuotaValues | QuotaChange,
    cluster: Any = None,
) -> Quota:
    """Create or update the quota of `tenant` for `flavor` after checking the whole tree:
    the global one, or with `cluster` (a `scheduler.Cluster`) the one pinned to that cluster
    (`tenants.quotas.pins`). `values`: all of them, or a change naming some (an approved
    quota request's): the others as the row has them under its lock
    (`tenants.quotas.changes`).

    Locks the parent's global quota row (and this one) so concurrent changes to siblings
    serialise, and the tenant's row, so its global quota and its pins change one at a time.
    """
    if not access.can_set_quota(user, tenant):
        raise PermissionDenied(
            f"Quotas of '{tenant.slug}' are set by admins of its parent or by platform admins."
        )
    parent_quota = None
    if tenant.parent_id is not None:
        parent_quota = (
            Quota.objects.select_for_update()
            .filter(tenant_id=tenant.parent_id, flavor=flavor, cluster__isnull=True)
            .first()
        )
    # A pin is checked against the parent's pin on the cluster and the siblings' pins there:
    # lock the parent's row too (ancestors first), so a parent's pin lowered while a child
    # pins cannot both pass.
    locked = (
        [tenant.pk]
        if cluster is None or tenant.parent_id is None
        else [tenant.parent_id, tenant.pk]
    )
    for pk in locked:
        list(Tenant.objects.select_for_update().filter(pk=pk).values_list("pk"))
    quota = (
        Quota.objects.select_for_update().filter(tenant=tenant, flavor=flavor, cluster=cluster)
        if cluster is not None
        else Quota.objects.select_for_update().filter(
            tenant=tenant, flavor=flavor, cluster__isnull=True
        )
    ).first()
    if not isinstance(values, QuotaValues):
        values = values_with(quota, change_of(values))
    if cluster is not None:
        validate_pinned(tenant, flavor, cluster, values, parent_quota)
    else:
        validate_quota(tenant, flavor, values, parent_quota)
        errors = check_global_holds_pins(tenant, flavor, values)
        for name, messages in check_global_holds_childrens_pins(tenant, flavor, values).items():
            errors.setdefault(name, []).extend(messages)
        if errors:
            raise ValidationError(errors)
    before = audit_snapshot(quota)
    quota = quota or Quota(tenant=tenant, flavor=flavor, cluster=cluster)
    quota.guaranteed_milli = values.guaranteed_milli
    quota.limit_milli = values.limit_milli
    quota.lend_limit_milli = values.lend_limit_milli
    quota.weight = values.weight  # type: ignore[assignment]
    quota.user_limit_milli = values.user_limit_milli
    quota.save()
    audit_record(
        actor=user,
        action="quota.set",
        tenant=tenant,
        target=quota,
        before=before,
        after=audit_snapshot(quota),
    )
    return quota


@transaction.atomic
def quota_delete(*, user: Any, quota: Quota) -> None:
    if not access.can_set_quota(user, quota.tenant):
        raise PermissionDenied(
            f"Quotas of '{quota.tenant.slug}' are set by admins of its parent "
            "or by platform admins."
        )
    # Without this quota the tenant holds none, and beneath it only 0/0 may stand
    # (`tenants.quotas.rules`): a child's guarantee or limit would be a quota handed
    # down from nothing.
    # A pinned quota hands nothing down: without it the tenant's global quota still holds.
    children = Quota.objects.filter(
        tenant__parent=quota.tenant, flavor=quota.flavor, cluster__isnull=True
    )
    holding = sorted(children.filter(limit_milli__gt=0).values_list("tenant__slug", flat=True))
    if holding and quota.cluster_id is None:
        raise ValidationError(
            f"'{quota.tenant.slug}' still gives {quota.flavor.name} quota to its children "
            f"({', '.join(holding)}); remove or zero theirs first."
        )
    before, target = audit_snapshot(quota), ("tenants.quota", quota.pk)
    quota.delete()
    audit_record(
        actor=user,
        action="quota.delete",
        tenant=quota.tenant,
        target=target,
        before=before,
        after=None,
    )
