"""The changes a what-if proposes, checked against what exists and what the user may change.

A change is a dict, stored as validated:
- `{"kind": "quota", "tenant": slug, "flavor": name, "cluster"?: name, "guaranteed_milli"?,
  "limit_milli"?, "lend_limit_milli"?, "weight"?, "user_limit_milli"?}`: a tenant's quota of
  a flavor, global, or with `cluster` the one pinned to that cluster (guarantee and limit
  only, as `tenants.quotas.pins` says) (a field left out keeps today's value; a quota that
  does not exist starts from zero);
- `{"kind": "priority_class", "name": name, "value": int}`: a priority class's value.

Who may propose what is who may make the change: quotas are set from above (`can_set_quota`:
an admin of a strict ancestor, or a platform admin), priority classes by platform admins. A
tenant the user cannot see is "unknown", exactly as one that does not exist.
"""

from __future__ import annotations

from typing import Any

from django.core.exceptions import ValidationError

from scheduler.models import Cluster
from scheduler.snapshot.translate import load_nodes
from tenants import access
from tenants.models import PriorityClass, Quota, ResourceFlavor, Tenant
from whatif.inventory import ACTIONS, DEMAND, INVENTORY, inventory_errors

MAX_CHANGES = 50
QUOTA_FIELDS = ("guaranteed_milli", "limit_milli", "lend_limit_milli", "weight", "user_limit_milli")


def changes_validate(*, user: Any, scope: Tenant | None, changes: list[dict[str, Any]]) -> None:
    """Raise ValidationError naming each bad field as `changes[i].field`; None when all is
    well. `changes` is the shape-checked input (kinds, types and ranges already checked)."""
    if len(changes) > MAX_CHANGES:
        raise ValidationError({"changes": [f"at most {MAX_CHANGES} changes in one what-if."]})
    errors: dict[str, list[str]] = {}
    visible = {t.slug: t for t in access.tenants_visible(user).filter(slug__in=_named(changes))}
    flavors = set(ResourceFlavor.objects.values_list("name", flat=True))
    classes = dict(PriorityClass.objects.values_list("name", "value"))
    clusters = set(Cluster.objects.values_list("name", flat=True))
    seen: set[tuple[str, ...]] = set()
    for i, change in enumerate(changes):
        found = (
            _quota_errors(user, scope, change, visible, flavors, clusters)
            if change["kind"] == "quota"
            else _class_errors(user, change, classes, changes)
        )
        key = _key(change)
        if key in seen:
            found.setdefault("kind", []).append("the same setting is changed twice.")
        seen.add(key)
        for field, messages in found.items():
            errors[f"changes[{i}].{field}"] = messages
    if errors:
        raise ValidationError(errors)


def _named(changes: list[dict[str, Any]]) -> set[str]:
    return {c["tenant"] for c in changes if c["kind"] == "quota"}


def _key(change: dict[str, Any]) -> tuple[str, ...]:
    if change["kind"] == "quota":
        return ("quota", change["tenant"], change["flavor"], change.get("cluster") or "")
    return ("priority_class", change["name"])


def _quota_errors(
    user: Any,
    scope: Tenant | None,
    change: dict[str, Any],
    visible: dict[str, Tenant],
    flavors: set[str],
    clusters: set[str],
) -> dict[str, list[str]]:
    errors: dict[str, list[str]] = {}
    tenant = visible.get(change["tenant"])
    if tenant is None:
        errors["tenant"] = [f"unknown tenant '{change['tenant']}'."]
    elif scope is not None and not tenant.path.startswith(scope.path):
        errors["tenant"] = [f"'{tenant.slug}' is outside this what-if's scope '{scope.slug}'."]
    elif not access.can_set_quota(user, tenant):
        errors["tenant"] = [
            f"you may not change the quota of '{tenant.slug}' (quotas are set from above); "
            "ask for it with a quota request."
        ]
    if change["flavor"] not in flavors:
        errors["flavor"] = [f"unknown flavor '{change['flavor']}'."]
    if change.get("cluster") and change["cluster"] not in clusters:
        errors["cluster"] = [f"unknown cluster '{change['cluster']}'."]
    elif change.get("cluster"):
        errors.update(_pin_fields(change))
    if not any(field in change for field in QUOTA_FIELDS):
        errors["kind"] = [f"a quota change sets at least one of {', '.join(QUOTA_FIELDS)}."]
    if tenant is not None and not errors:
        errors.update(_bounds(tenant, change))
    return errors


def _pin_fields(change: dict[str, Any]) -> dict[str, list[str]]:
    """A pinned quota sets a guarantee and a limit only (`tenants.quotas.pins`)."""
    return {
        field: [
            f"a quota pinned to a cluster sets guaranteed_milli and limit_milli only; {field} "
            f"belongs to the global quota of {change['flavor']}."
        ]
        for field in ("lend_limit_milli", "weight", "user_limit_milli")
        if change.get(field) is not None
    }


def _bounds(tenant: Tenant, change: dict[str, Any]) -> dict[str, list[str]]:
    """The limit includes the guarantee, and only a guarantee is lent: with today's values
    for the fields the change leaves out (of the pinned row when the change names a
    cluster)."""
    rows = Quota.objects.filter(tenant=tenant, flavor__name=change["flavor"])
    cluster = change.get("cluster")
    rows = rows.filter(cluster__name=cluster) if cluster else rows.filter(cluster__isnull=True)
    today = rows.values().first()
    now: dict[str, Any] = dict(today) if today else {}
    merged: dict[str, Any] = {field: now.get(field) for field in QUOTA_FIELDS}
    merged.update({k: v for k, v in change.items() if k in QUOTA_FIELDS})
    guaranteed, limit = merged["guaranteed_milli"] or 0, merged["limit_milli"] or 0
    if limit < guaranteed:
        return {"limit_milli": [f"the limit ({limit}) is below the guarantee ({guaranteed})."]}
    lend = merged["lend_limit_milli"]
    if lend is not None and lend > guaranteed:
        return {"lend_limit_milli": [f"lends ({lend}) more than it is guaranteed ({guaranteed})."]}
    per_user = merged["user_limit_milli"]
    if per_user is not None and per_user > limit:
        return {"user_limit_milli": [f"one user's cap ({per_user}) exceeds the limit ({limit})."]}
    return {}


def _class_errors(
    user: Any, change: dict[str, Any], classes: dict[str, int], changes: list[dict[str, Any]]
) -> dict[str, list[str]]:
    if not access.grants_for(user).platform_admin:
        return {"name": ["only platform admins change priority classes."]}
    if change["name"] not in classes:
        return {"name": [f"unknown priority class '{change['name']}'."]}
    values = dict(classes)
    values.update({c["name"]: c["value"] for c in changes if c["kind"] == "priority_class"})
    if sum(1 for v in values.values() if v == change["value"]) > 1:
        return {"value": [f"another priority class has the value {change['value']}."]}
    return {}


# --- expansions (whatif/inventory.py) -------------------------------------------------------

MAX_EXPANSION_GPUS = 10_000


def expansion_validate(changes: list[dict[str, Any]]) -> None:
    """An expansion: one demand change and one inventory change of known flavors, the
    inventory change possible on the nodes present now. ValidationError names the field."""
    flavors = set(ResourceFlavor.objects.values_list("name", flat=True))
    errors: dict[str, list[str]] = {}
    kinds = sorted(c.get("kind", "") for c in changes)
    if kinds != sorted([DEMAND, INVENTORY]):
        raise ValidationError({"changes": ["an expansion is one demand and one inventory change."]})
    for change in changes:
        if change["flavor"] not in flavors:
            errors["flavor"] = [f"unknown flavor '{change['flavor']}'."]
    inventory = next(c for c in changes if c["kind"] == INVENTORY)
    if inventory["action"] not in ACTIONS:
        errors["action"] = [f"one of {', '.join(ACTIONS)}."]
    if not 1 <= inventory["gpus"] <= MAX_EXPANSION_GPUS:
        errors["gpus"] = [f"from 1 to {MAX_EXPANSION_GPUS} GPUs."]
    if not errors:
        errors.update(inventory_errors(inventory, list(load_nodes()[0].values())))
    if errors:
        raise ValidationError(errors)
