"""Reads on the organisation, scoped to what the user may see."""

from __future__ import annotations

from typing import Any

from django.db.models import Q, QuerySet
from django.utils import timezone

from common.db.shared_reads import shared
from tenants import access
from tenants.models import (
    ApprovalKind,
    ApprovalPolicy,
    ApprovalRequest,
    ApprovalState,
    AuditEntry,
    PriorityClass,
    PriorityDefault,
    Quota,
    ResourceFlavor,
    Role,
)


@shared
def flavor_names() -> list[str]:
    """Every flavor's name, in order (shared by a batch of submissions: common/db/shared_reads)."""
    return list(ResourceFlavor.objects.order_by("name").values_list("name", flat=True))


@shared
def priority_class_named(name: str) -> PriorityClass | None:
    return PriorityClass.objects.filter(name=name).first()


def quota_list_visible(user: Any) -> QuerySet[Quota]:
    return access.visible_by_tenant(
        user, Quota.objects.select_related("tenant", "flavor", "cluster")
    )


def priority_default_list_visible(user: Any) -> QuerySet[PriorityDefault]:
    """Platform-wide defaults (tenant null) plus those of the user's subtrees."""
    rows = PriorityDefault.objects.select_related("priority_class")
    grants = access.grants_for(user)
    if grants.sees_everything:
        return rows
    return rows.filter(Q(tenant__isnull=True) | grants.subtree_q(prefix="tenant__"))


# --- approvals and audit -----------------------------------------------------------------


def policy_list_visible(user: Any) -> QuerySet[ApprovalPolicy]:
    rows = ApprovalPolicy.objects.select_related("tenant", "priority_class")
    return access.visible_by_tenant(user, rows)


def approval_list_visible(user: Any) -> QuerySet[ApprovalRequest]:
    """Requests of the user's subtrees (a member sees their team's), newest first."""
    rows = ApprovalRequest.objects.select_related("tenant", "requester", "decided_by")
    return access.visible_by_tenant(user, rows)


def approval_list_inbox(user: Any) -> QuerySet[ApprovalRequest]:
    """Pending, unexpired requests the user may decide (see `approvals.can_decide`)."""
    rows = (
        approval_list_visible(user)
        .filter(state=ApprovalState.PENDING, expires_at__gt=timezone.now())
        .exclude(requester_id=user.pk)
    )
    grants = access.grants_for(user)
    if grants.platform_admin:
        return rows
    jobs = Q(kind=ApprovalKind.JOB) & grants.subtree_q(min_role=Role.APPROVER, prefix="tenant__")
    # Quota requests go to admins strictly above the tenant: those who may set its quota.
    above = Q(pk__in=[])
    for path, role in grants.roles_by_path.items():
        if role == Role.ADMIN:
            above |= Q(tenant__path__startswith=path) & ~Q(tenant__path=path)
    return rows.filter(jobs | (Q(kind=ApprovalKind.QUOTA) & above))


def audit_list_visible(user: Any) -> QuerySet[AuditEntry]:
    """Admins see their subtrees' entries; platform admins and finance all; members none."""
    rows = AuditEntry.objects.select_related("tenant")
    grants = access.grants_for(user)
    if grants.sees_everything:
        return rows
    return rows.filter(grants.subtree_q(min_role=Role.ADMIN, prefix="tenant__"))
