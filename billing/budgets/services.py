"""Writes on budgets: create, change the limit or the policy, delete. Audited.

Who: a budget is set from above, as quotas are: by finance and platform admins, or by the
admins of the tenant or of an ancestor, and it records where it was set from (`set_at`: the
highest tenant of the chain the writer administers; None for finance and platform admins).
It is changed or deleted only from there or above (`access.can_write_rule`), so a team
admin may set budgets of their own on their team (every budget over a job applies, so one
more only adds a limit) but never raise or delete one set from above. A tenant the user
cannot see never reaches here (the API reads it through the visible tenants: a 400 naming
the field, or a 404 for a budget).
"""

from __future__ import annotations

from datetime import datetime
from decimal import Decimal
from typing import Any

from django.db import IntegrityError, transaction

from billing.budgets.spend import CENT, THRESHOLDS, position_of
from billing.models import Budget, BudgetAlert
from common.errors import ConflictError
from tenants import access
from tenants.audit import audit_record, audit_snapshot
from tenants.models import Tenant

AUDIT_FIELDS = ["tenant", "month", "unit", "limit", "policy", "set_at"]


def can_manage_budget(user: Any, budget: Budget) -> bool:
    """Whether `user` may change or delete `budget` (see the module's docstring)."""
    return access.can_write_rule(user, budget.set_at, finance=True)


def _require(user: Any, budget: Budget) -> None:
    access.require_write_rule(
        user, budget.set_at, f"The budget of '{budget.tenant.slug}'", finance=True
    )


def _snapshot(budget: Budget) -> dict[str, Any]:
    # The limit as its decimal string: a float would not keep it to the cent.
    return {**audit_snapshot(budget, AUDIT_FIELDS), "limit": f"{budget.limit:f}"}


@transaction.atomic
def budget_create(
    *, user: Any, tenant: Tenant, month: datetime, unit: str, limit: Decimal, policy: str
) -> Budget:
    """A ConflictError when the tenant has a budget for the month already."""
    set_at = access.rule_origin(user, tenant, finance=True)
    try:
        with transaction.atomic():
            budget = Budget.objects.create(
                tenant=tenant,
                month=month,
                unit=unit,
                limit=limit.quantize(CENT),
                policy=policy,
                created_by=user,
                set_at=set_at,
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
    budget = Budget.objects.select_for_update().select_related("tenant").get(pk=budget.pk)
    _require(user, budget)
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
    _require(user, budget)
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
