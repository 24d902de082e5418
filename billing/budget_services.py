"""Writes on budgets: create, change the limit or the policy, delete. Audited.

Who: finance and platform admins for every tenant; a tenant admin for the tenants of their
subtree (`access.can_manage_tenant`). A tenant the user cannot see never reaches here (the
API reads it through the visible tenants: a 400 naming the field, or a 404 for a budget).
"""

from __future__ import annotations

from datetime import datetime
from decimal import Decimal
from typing import Any

from django.core.exceptions import PermissionDenied
from django.db import IntegrityError, transaction

from billing.budgets import CENT, THRESHOLDS, position_of
from billing.models import Budget, BudgetAlert
from common.errors import ConflictError
from tenants import access
from tenants.audit import audit_record, audit_snapshot
from tenants.models import Tenant

AUDIT_FIELDS = ["tenant", "month", "unit", "limit", "policy"]


def can_manage_budget(user: Any, tenant: Tenant) -> bool:
    grants = access.grants_for(user)
    return grants.sees_everything or access.can_manage_tenant(user, tenant)


def _require(user: Any, tenant: Tenant) -> None:
    if not can_manage_budget(user, tenant):
        raise PermissionDenied(
            f"Budgets of '{tenant.slug}' are set by its admins (or an ancestor's), finance "
            "and platform admins."
        )


def _snapshot(budget: Budget) -> dict[str, Any]:
    # The limit as its decimal string: a float would not keep it to the cent.
    return {**audit_snapshot(budget, AUDIT_FIELDS), "limit": f"{budget.limit:f}"}


@transaction.atomic
def budget_create(
    *, user: Any, tenant: Tenant, month: datetime, unit: str, limit: Decimal, policy: str
) -> Budget:
    """A ConflictError when the tenant has a budget for the month already."""
    _require(user, tenant)
    try:
        with transaction.atomic():
            budget = Budget.objects.create(
                tenant=tenant,
                month=month,
                unit=unit,
                limit=limit.quantize(CENT),
                policy=policy,
                created_by=user,
            )
    except IntegrityError:
        raise ConflictError(
            f"'{tenant.slug}' has a budget for {month:%Y-%m} already; change that one."
        ) from None
    audit_record(
        actor=user,
        action="budget.create",
        tenant=tenant,
        target=budget,
        before=None,
        after=_snapshot(budget),
    )
    return budget


@transaction.atomic
def budget_update(
    *, user: Any, budget: Budget, limit: Decimal | None = None, policy: str | None = None
) -> Budget:
    """Change the limit and/or the policy. Alerts of thresholds the new limit puts out of
    reach are forgotten, so that they go out again if the budget reaches them later."""
    _require(user, budget.tenant)
    budget = Budget.objects.select_for_update().select_related("tenant").get(pk=budget.pk)
    before = _snapshot(budget)
    if limit is not None:
        budget.limit = limit.quantize(CENT)
    if policy is not None:
        budget.policy = policy
    budget.save()
    percent = position_of(budget).percent
    BudgetAlert.objects.filter(
        budget=budget, threshold__in=[t for t in THRESHOLDS if percent < t]
    ).delete()
    audit_record(
        actor=user,
        action="budget.update",
        tenant=budget.tenant,
        target=budget,
        before=before,
        after=_snapshot(budget),
    )
    return budget


@transaction.atomic
def budget_delete(*, user: Any, budget: Budget) -> None:
    _require(user, budget.tenant)
    before = _snapshot(budget)
    audit_record(
        actor=user,
        action="budget.delete",
        tenant=budget.tenant,
        target=budget,
        before=before,
        after=None,
    )
    budget.delete()
