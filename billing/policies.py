"""The billing policy of an organisation: where idle reserved capacity goes (platform admins)."""

from __future__ import annotations

from typing import Any

from django.core.exceptions import ValidationError
from django.db import transaction

from billing.models import BillingPolicy, IdlePolicy
from tenants import access
from tenants.audit import audit_record
from tenants.models import Tenant


@transaction.atomic
def billing_policy_set(*, user: Any, organisation: Tenant, idle_policy: str) -> BillingPolicy:
    """Set `organisation`'s idle capacity policy (audited). It applies to statements made
    from now on; closed statements keep the lines they were closed with."""
    access.require_platform_admin(user)
    if organisation.parent_id is not None:
        raise ValidationError({"organisation": ["a policy is set per organisation (a root)."]})
    if idle_policy not in IdlePolicy.values:
        raise ValidationError({"idle_policy": [f"one of {', '.join(IdlePolicy.values)}."]})
    policy, _ = BillingPolicy.objects.select_for_update().get_or_create(organisation=organisation)
    before = policy.idle_policy
    policy.idle_policy = idle_policy
    policy.save(update_fields=["idle_policy"])
    audit_record(
        actor=user,
        action="billing_policy.set",
        tenant=organisation,
        target=policy,
        before={"idle_policy": before},
        after={"idle_policy": idle_policy},
    )
    return policy
