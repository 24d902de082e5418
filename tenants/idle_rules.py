"""Idle rules: when a tenant's allocated GPUs count as idle, and what then happens.

A rule holds for the tenant's subtree; without one the settings' defaults apply
(GANTRY_IDLE_*). `scheduler.telemetry.idle` applies them; admins of the tenant (or above) and
platform admins set them here, audited, and each rule records where it was set from (`set_at`, as
budgets and approval policies do: tenants/access.py).

- A rule set from above the tenant (by an ancestor's admins or a platform admin) replaces
  the one in force above it; only they (or those above) change or remove it.
- A rule of the tenant's own (set by its own admins) may only be stricter than the one in
  force above it: a 400 names each looser field when set, and it is combined field by field
  with the one above when read, so a rule above made stricter later still holds below.

Stricter means more is caught, sooner, with at least as much done: a threshold at or above
(more utilization counts as idle), a duration at or below, an action at or above in
nothing < notify < notify_and_stop.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from django.conf import settings
from django.core.exceptions import PermissionDenied, ValidationError
from django.db import transaction

from tenants import access
from tenants.audit import audit_record, audit_snapshot
from tenants.models import IdleAction, IdleRule, Tenant

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


ACTION_RANK: dict[str, int] = {
    IdleAction.NOTHING: 0,
    IdleAction.NOTIFY: 1,
    IdleAction.NOTIFY_AND_STOP: 2,
}


def stricter(above: Rule, own: Rule) -> Rule:
    """`own` held to at least the strictness of `above`, field by field."""
    return Rule(
        max(above.threshold_pct, own.threshold_pct),
        min(above.duration_s, own.duration_s),
        max(above.action, own.action, key=lambda a: ACTION_RANK.get(a, 0)),
    )


def looser_fields(own: Rule, above: Rule) -> dict[str, list[str]]:
    """The fields where `own` is looser than `above`, with why (in the API's units)."""
    errors: dict[str, list[str]] = {}
    if own.threshold_pct < above.threshold_pct:
        errors["threshold_pct"] = [f"must be at least {above.threshold_pct:g}"]
    if own.duration_s > above.duration_s:
        errors["duration_minutes"] = [f"must be at most {above.duration_s / 60:g}"]
    if ACTION_RANK.get(own.action, 0) < ACTION_RANK.get(above.action, 0):
        errors["action"] = [f"must be {above.action} or stricter"]
    why = " (the rule in force above: a tenant's own rule may only be stricter)."
    return {field: [text + why for text in texts] for field, texts in errors.items()}


def _chains(tenant_ids: Iterable[int]) -> dict[int, list[int]]:
    paths = dict(Tenant.objects.filter(id__in=list(tenant_ids)).values_list("id", "path"))
    return {t: [int(p) for p in path.strip("/").split("/") if p] for t, path in paths.items()}


def _rules(chains: dict[int, list[int]]) -> dict[int, tuple[Rule, bool]]:
    """{tenant: (its rule, whether it is its own: set by its own admins)}."""
    wanted = {a for chain in chains.values() for a in chain}
    return {
        r.tenant_id: (Rule(r.threshold_pct, r.duration_s, r.action), r.set_at_id == r.tenant_id)
        for r in IdleRule.objects.filter(tenant_id__in=wanted)
    }


def _in_force(chain: list[int], rules: dict[int, tuple[Rule, bool]]) -> Rule:
    """The rule in force at the end of `chain` (root first)."""
    current = default_rule()
    for at in chain:
        if at in rules:
            rule, own = rules[at]
            current = stricter(current, rule) if own else rule
    return current


def rule_for_tenants(tenant_ids: Iterable[int]) -> dict[int, Rule]:
    """The rule in force for each tenant (see the module's docstring). Two queries whatever
    the number of tenants."""
    chains = _chains(tenant_ids)
    rules = _rules(chains)
    return {tenant: _in_force(chain, rules) for tenant, chain in chains.items()}


def idle_rule_effective(tenant: Tenant) -> EffectiveRule:
    """The rule in force for `tenant` and where it comes from."""
    chain = tenant.ancestor_ids()
    rules = _rules({tenant.pk: chain})
    if tenant.pk in rules:
        origin = "own"
    elif any(at in rules for at in chain):
        origin = "inherited"
    else:
        origin = "default"
    return EffectiveRule(_in_force(chain, rules), origin)


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


def _require_write(user: Any, rule: IdleRule, tenant: Tenant) -> None:
    access.require_write_rule(user, rule.set_at, f"The idle rule of '{tenant.slug}'")


@transaction.atomic
def idle_rule_set(
    *, user: Any, tenant: Tenant, threshold_pct: float, duration_s: int, action: str
) -> IdleRule:
    """Set the tenant's own rule (its subtree follows it unless a tenant below sets one).
    The caller validated the ranges; the model's constraints hold them in any case. A rule
    set from above is changed only from there or above (403); a rule of the tenant's own
    that is looser than the one in force above it is a 400 naming each looser field."""
    _require_manage(user, tenant)
    rule = IdleRule.objects.select_for_update().filter(tenant=tenant).first()
    if rule is not None:
        _require_write(user, rule, tenant)
    before = audit_snapshot(rule, AUDITED)
    if rule is None:
        set_at = access.rule_origin(user, tenant)
        rule = IdleRule(tenant=tenant, created_by=user, set_at=set_at)
    if rule.set_at_id == tenant.pk:
        chain = tenant.ancestor_ids()[:-1]
        above = _in_force(chain, _rules({tenant.pk: chain}))
        looser = looser_fields(Rule(threshold_pct, duration_s, action), above)
        if looser:
            raise ValidationError(looser)
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
    False when it had none. A rule set from above is removed only from there or above."""
    _require_manage(user, tenant)
    rule = IdleRule.objects.select_for_update().filter(tenant=tenant).first()
    if rule is None:
        return False
    _require_write(user, rule, tenant)
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
