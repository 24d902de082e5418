"""Approval policies: rules on a tenant that send its subtree's jobs and quota requests to
approvers (the cost rule among them). Created by admins of the tenant (or above) and platform
admins, recording where they were set from (`set_at`); changed, deactivated or removed only
from there or above (`access.can_write_rule`), so a team admin may add policies of their own
(every policy over a job applies: one more is only stricter) but never loosen one set from
above. Every change is audited."""

from __future__ import annotations

from decimal import Decimal, InvalidOperation
from typing import Any

from django.core.exceptions import PermissionDenied, ValidationError
from django.db import transaction

from tenants import access
from tenants.audit import audit_record, audit_snapshot
from tenants.models import ApprovalPolicy, PriorityClass, Tenant


def require_manage(user: Any, tenant: Tenant) -> None:
    if not access.can_manage_tenant(user, tenant):
        raise PermissionDenied(f"You are not an admin of tenant '{tenant.slug}'.")


def _require_write(user: Any, policy: ApprovalPolicy) -> None:
    what = f"Policy {policy.pk} of '{policy.tenant.slug}'"
    access.require_write_rule(user, policy.set_at, what)


def _decimal(value: Any) -> Decimal | None:
    if value is None:
        return None
    try:
        return Decimal(str(value))
    except InvalidOperation:
        raise ValidationError({"threshold": [f"{str(value)[:40]!r} is not a number."]}) from None


@transaction.atomic
def policy_set(
    *,
    user: Any,
    tenant: Tenant,
    rule: str,
    threshold: Any = None,
    priority_class: PriorityClass | None = None,
    applies_to_jobs: bool = True,
    applies_to_quota: bool = False,
    active: bool = True,
    description: str = "",
    policy: ApprovalPolicy | None = None,
) -> ApprovalPolicy:
    """Create a policy on `tenant`, or replace the settings of `policy` (which stays there,
    set from where it was)."""
    before = None
    if policy is None:
        set_at = access.rule_origin(user, tenant)
        policy = ApprovalPolicy(tenant=tenant, created_by=user, set_at=set_at)
    else:
        require_manage(user, tenant)
        policy = ApprovalPolicy.objects.select_for_update().get(pk=policy.pk)
        if policy.tenant_id != tenant.pk:
            raise ValidationError({"tenant": ["a policy cannot move to another tenant."]})
        _require_write(user, policy)
        before = audit_snapshot(policy)
    policy.rule, policy.threshold = rule, _decimal(threshold)
    policy.priority_class = priority_class
    policy.applies_to_jobs, policy.applies_to_quota = applies_to_jobs, applies_to_quota
    policy.active, policy.description = active, description
    _check_policy_arguments(policy)
    policy.full_clean(validate_constraints=True)
    policy.save()
    audit_record(
        actor=user,
        action="policy.set",
        tenant=tenant,
        target=policy,
        before=before,
        after=audit_snapshot(policy),
    )
    return policy


def _check_policy_arguments(policy: ApprovalPolicy) -> None:
    """The messages behind the database's `approval_policy_*` constraints."""
    errors: dict[str, list[str]] = {}
    if policy.rule == "priority_at_least":
        if policy.priority_class is None:
            errors["priority_class"] = ["the rule 'priority_at_least' needs a priority class."]
        if policy.threshold is not None:
            errors["threshold"] = ["the rule 'priority_at_least' takes no threshold."]
    elif policy.rule == "borrowing":
        if policy.threshold is not None or policy.priority_class is not None:
            errors["threshold"] = ["the rule 'borrowing' takes no threshold or priority class."]
    else:
        if policy.threshold is None or policy.threshold < 0:
            errors["threshold"] = [f"the rule '{policy.rule}' needs a threshold of 0 or more."]
        if policy.priority_class is not None:
            errors["priority_class"] = [f"the rule '{policy.rule}' takes no priority class."]
    if not (policy.applies_to_jobs or policy.applies_to_quota):
        errors["applies_to_jobs"] = ["a policy must apply to jobs, quota requests or both."]
    if errors:
        raise ValidationError(errors)


@transaction.atomic
def policy_delete(*, user: Any, policy: ApprovalPolicy) -> None:
    require_manage(user, policy.tenant)
    _require_write(user, policy)
    before = audit_snapshot(policy)
    target = ("tenants.approvalpolicy", policy.pk)
    policy.delete()
    audit_record(
        actor=user,
        action="policy.delete",
        tenant=policy.tenant,
        target=target,
        before=before,
        after=None,
    )
