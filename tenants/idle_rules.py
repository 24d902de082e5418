"""Idle rules: when a tenant's allocated GPUs count as idle, and what then happens.

A rule holds for the tenant's subtree; the nearest rule up the tree wins, and without one
the settings' defaults apply (GANTRY_IDLE_*). `scheduler.idle` applies them; admins of the
tenant (or above) and platform admins set them here, audited.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from django.conf import settings
from django.core.exceptions import PermissionDenied
from django.db import transaction

from tenants import access
from tenants.audit import audit_record, audit_snapshot
from tenants.models import IdleRule, Tenant

AUDITED = ("threshold_pct", "duration_s", "action")


@dataclass(frozen=True)
class Rule:
    threshold_pct: float
    duration_s: float
    action: str


@dataclass(frozen=True)
class EffectiveRule:
    rule: Rule
    origin: str  # "own", "inherited" (from a tenant above) or "default" (the settings)


def default_rule() -> Rule:
    return Rule(
        settings.GANTRY_IDLE_THRESHOLD_PCT,
        settings.GANTRY_IDLE_DURATION_S,
        settings.GANTRY_IDLE_ACTION,
    )


def _chains(tenant_ids: Iterable[int]) -> dict[int, list[int]]:
    paths = dict(Tenant.objects.filter(id__in=list(tenant_ids)).values_list("id", "path"))
    return {t: [int(p) for p in path.strip("/").split("/") if p] for t, path in paths.items()}


def _rules(chains: dict[int, list[int]]) -> dict[int, Rule]:
    wanted = {a for chain in chains.values() for a in chain}
    return {
        r.tenant_id: Rule(r.threshold_pct, r.duration_s, r.action)
        for r in IdleRule.objects.filter(tenant_id__in=wanted)
    }


def rule_for_tenants(tenant_ids: Iterable[int]) -> dict[int, Rule]:
    """The rule in force for each tenant: its own, else the nearest ancestor's, else the
    defaults. Two queries whatever the number of tenants."""
    chains = _chains(tenant_ids)
    rules = _rules(chains)
    fallback = default_rule()
    return {
        tenant: next((rules[a] for a in reversed(chain) if a in rules), fallback)
        for tenant, chain in chains.items()
    }


def idle_rule_effective(tenant: Tenant) -> EffectiveRule:
    """The rule in force for `tenant` and where it comes from."""
    chain = tenant.ancestor_ids()
    rules = _rules({tenant.pk: chain})
    for at in reversed(chain):
        if at in rules:
            return EffectiveRule(rules[at], "own" if at == tenant.pk else "inherited")
    return EffectiveRule(default_rule(), "default")


def idle_rule_view(tenant: Tenant) -> dict[str, Any]:
    """The tenant's own rule and the one in force, in the API's and portal's units."""

    def values(rule: Any) -> dict[str, Any]:
        return {
            "threshold_pct": rule.threshold_pct,
            "duration_minutes": round(rule.duration_s / 60),
            "action": rule.action,
        }

    own = IdleRule.objects.filter(tenant=tenant).first()
    effective = idle_rule_effective(tenant)
    return {
        "tenant": tenant.pk,
        "own": values(own) if own else None,
        "effective": {**values(effective.rule), "origin": effective.origin},
    }


def _require_manage(user: Any, tenant: Tenant) -> None:
    if not access.can_manage_tenant(user, tenant):
        raise PermissionDenied(f"You are not an admin of tenant '{tenant.slug}'.")


@transaction.atomic
def idle_rule_set(
    *, user: Any, tenant: Tenant, threshold_pct: float, duration_s: int, action: str
) -> IdleRule:
    """Set the tenant's own rule (its subtree follows it unless a tenant below sets one).
    The caller validated the ranges; the model's constraints hold them in any case."""
    _require_manage(user, tenant)
    rule = IdleRule.objects.select_for_update().filter(tenant=tenant).first()
    before = audit_snapshot(rule, AUDITED)
    rule = rule or IdleRule(tenant=tenant)
    rule.threshold_pct, rule.duration_s, rule.action = threshold_pct, duration_s, action
    rule.full_clean(validate_constraints=True)
    rule.save()
    audit_record(
        actor=user,
        action="tenant.idle_rule.set",
        tenant=tenant,
        target=rule,
        before=before,
        after=audit_snapshot(rule, AUDITED),
    )
    return rule


@transaction.atomic
def idle_rule_delete(*, user: Any, tenant: Tenant) -> bool:
    """Remove the tenant's own rule: it follows the nearest rule above, or the defaults.
    False when it had none."""
    _require_manage(user, tenant)
    rule = IdleRule.objects.select_for_update().filter(tenant=tenant).first()
    if rule is None:
        return False
    before = audit_snapshot(rule, AUDITED)
    audit_record(
        actor=user,
        action="tenant.idle_rule.delete",
        tenant=tenant,
        target=rule,
        before=before,
        after=None,
    )
    rule.delete()
    return True
