"""Quotas pinned to a cluster: how they combine with the global quota tree (issue 38).

A quota naming a cluster holds for that cluster's nodes only; a global one (no cluster) holds
across every cluster (docs/multicluster.md, "Quotas pinned to a cluster"). They combine so:

- pinned guarantees count inside the global one: the pinned guarantees of a tenant and flavor
  sum to at most its global guarantee, and each pinned limit is at most its global limit;
- a tenant that pins a flavor and sets no global quota on it holds, globally, the sums of its
  pinned guarantees and limits; those sums are checked against the parent's global quota as
  a global quota of the tenant would be;
- a pinned limit is at most the parent's pinned limit on the same cluster, when the parent
  pins one there;
- what the parent holds on a cluster caps its children's pinned guarantees there: the parent's
  pin on that cluster, else its global guarantee; the children's pinned guarantees on the
  cluster sum within it, and a parent's pin is not lowered below its children's there;
- a pinned quota sets a guarantee and a limit only: lending, per-user limits and the
  fair-share weight are the global quota's.

A contradictory combination is refused with what contradicts what; the caller
(`tenants.services.quota_set`) holds the tenant's row lock, so two pins of the same tenant
set at once are checked one after the other.
"""

from __future__ import annotations

from typing import Any

from django.core.exceptions import ValidationError
from django.db.models import Sum

from tenants.models import Quota, ResourceFlavor, Tenant
from tenants.quotas.rules import (
    QuotaValues,
    check_against_children,
    check_against_parent,
    check_own_bounds,
    gpus,
)


def _pinned(tenant: Tenant, flavor: ResourceFlavor, exclude: Any = None) -> Any:
    rows = Quota.objects.filter(tenant=tenant, flavor=flavor, cluster__isnull=False)
    return rows.exclude(cluster=exclude) if exclude is not None else rows


def validate_pinned(
    tenant: Tenant,
    flavor: ResourceFlavor,
    cluster: Any,
    values: QuotaValues,
    parent_quota: Quota | None,
) -> None:
    """Raise ValidationError (field -> messages) when a quota of `tenant` on `flavor` pinned
    to `cluster` breaks a rule above. `parent_quota`: the parent's global quota (locked)."""
    errors = check_own_bounds(tenant, values)
    where = f"{flavor.name} on cluster {cluster.name}"
    for name, value in (
        ("lend_limit_milli", values.lend_limit_milli),
        ("user_limit_milli", values.user_limit_milli),
    ):
        if value is not None:
            errors.setdefault(name, []).append(
                f"a quota pinned to a cluster sets guaranteed_milli and limit_milli only; "
                f"{name.removesuffix('_milli')} belongs to the global quota of {flavor.name}."
            )
    if values.weight != 1.0:
        errors.setdefault("weight", []).append(
            f"the fair-share weight of '{tenant.slug}' is its global quota's; a quota pinned "
            f"to a cluster takes none."
        )
    others = _pinned(tenant, flavor, exclude=cluster).aggregate(
        g=Sum("guaranteed_milli"), l=Sum("limit_milli")
    )
    pinned_g = values.guaranteed_milli + (others["g"] or 0)
    own_global = Quota.objects.filter(tenant=tenant, flavor=flavor, cluster__isnull=True).first()
    if own_global is not None:
        _within_global(errors, tenant, flavor, values, own_global, pinned_g)
    else:
        implied = QuotaValues(pinned_g, values.limit_milli + (others["l"] or 0), None, 1.0)
        for name, messages in check_against_parent(tenant, flavor, implied, parent_quota).items():
            errors.setdefault(name, []).extend(
                f"{m} (without a global quota, '{tenant.slug}' holds the sum of its pinned ones)"
                for m in messages
            )
    parent_pin = (
        None
        if tenant.parent_id is None
        else Quota.objects.filter(tenant_id=tenant.parent_id, flavor=flavor, cluster=cluster)
        .select_related("tenant")
        .first()
    )
    if parent_pin is not None and values.limit_milli > parent_pin.limit_milli:
        errors.setdefault("limit_milli", []).append(
            f"the limit of '{tenant.slug}' for {where} ({gpus(values.limit_milli)}) exceeds "
            f"the parent '{parent_pin.tenant.slug}''s limit there ({gpus(parent_pin.limit_milli)})."
        )
    _within_parent_on_cluster(errors, tenant, flavor, cluster, values, parent_pin, parent_quota)
    for name, messages in check_pin_holds_children(tenant, flavor, cluster, values).items():
        errors.setdefault(name, []).extend(messages)
    if errors:
        raise ValidationError(errors)


def _within_parent_on_cluster(
    errors: dict[str, list[str]],
    tenant: Tenant,
    flavor: ResourceFlavor,
    cluster: Any,
    values: QuotaValues,
    parent_pin: Quota | None,
    parent_quota: Quota | None,
) -> None:
    """The children's pinned guarantees on `cluster` sum within what the parent holds there:
    its pin on the cluster, else its global guarantee (a parent without either holds nothing
    to hand down, which `check_against_parent` already says)."""
    held = parent_pin if parent_pin is not None else parent_quota
    if held is None or tenant.parent_id is None:
        return
    siblings = (
        Quota.objects.filter(tenant__parent_id=tenant.parent_id, flavor=flavor, cluster=cluster)
        .exclude(tenant=tenant)
        .select_related("tenant")
        .order_by("tenant__slug")
    )
    parts = [(tenant.slug, values.guaranteed_milli)]
    parts += [(q.tenant.slug, q.guaranteed_milli) for q in siblings if q.guaranteed_milli]
    total = sum(m for _, m in parts)
    if total <= held.guaranteed_milli:
        return
    parent = tenant.parent
    assert parent is not None
    what = (
        f"its pinned guarantee there of {gpus(held.guaranteed_milli)}"
        if parent_pin is not None
        else f"its global guarantee of {gpus(held.guaranteed_milli)} (it pins none there)"
    )
    terms = " + ".join(f"{slug} {gpus(m)}" for slug, m in parts)
    errors.setdefault("guaranteed_milli", []).append(
        f"the guarantees of the children of '{parent.slug}' pinned to cluster {cluster.name} "
        f"for {flavor.name} would sum to {gpus(total)} ({terms}), above what '{parent.slug}' "
        f"holds on {cluster.name}: {what}."
    )


def check_pin_holds_children(
    tenant: Tenant, flavor: ResourceFlavor, cluster: Any, values: QuotaValues
) -> dict[str, list[str]]:
    """Errors when the pin of `tenant` on `cluster` would no longer hold its children's pins
    there (`check_against_children` on that cluster). Names the children."""
    return check_against_children(tenant, flavor, values, cluster)


def check_global_holds_childrens_pins(
    tenant: Tenant, flavor: ResourceFlavor, values: QuotaValues
) -> dict[str, list[str]]:
    """Errors when a global quota of `tenant` would fall below its children's pinned
    guarantees on a cluster where `tenant` pins nothing (there the global guarantee is what
    it holds)."""
    own_pins = _pinned(tenant, flavor).values_list("cluster_id", flat=True)
    children = (
        Quota.objects.filter(tenant__parent=tenant, flavor=flavor, cluster__isnull=False)
        .exclude(cluster_id__in=list(own_pins))
        .select_related("tenant", "cluster")
        .order_by("cluster__name", "tenant__slug")
    )
    by_cluster: dict[str, list[Quota]] = {}
    for q in children:
        assert q.cluster is not None  # filtered on cluster__isnull=False
        by_cluster.setdefault(q.cluster.name, []).append(q)
    messages = []
    for name, rows in by_cluster.items():
        total = sum(q.guaranteed_milli for q in rows)
        if total > values.guaranteed_milli:
            terms = " + ".join(f"{q.tenant.slug} {gpus(q.guaranteed_milli)}" for q in rows)
            messages.append(
                f"guaranteed ({gpus(values.guaranteed_milli)}) is below what the children of "
                f"'{tenant.slug}' pin on cluster {name} for {flavor.name}, where "
                f"'{tenant.slug}' pins nothing: {gpus(total)} ({terms})."
            )
    return {"guaranteed_milli": messages} if messages else {}


def _within_global(
    errors: dict[str, list[str]],
    tenant: Tenant,
    flavor: ResourceFlavor,
    values: QuotaValues,
    own_global: Quota,
    pinned_g: int,
) -> None:
    if pinned_g > own_global.guaranteed_milli:
        errors.setdefault("guaranteed_milli", []).append(
            f"the guarantees of '{tenant.slug}' pinned to clusters for {flavor.name} would sum "
            f"to {gpus(pinned_g)}, above its global guarantee of "
            f"{gpus(own_global.guaranteed_milli)}: pinned guarantees count inside it."
        )
    if values.limit_milli > own_global.limit_milli:
        errors.setdefault("limit_milli", []).append(
            f"the pinned limit of '{tenant.slug}' ({gpus(values.limit_milli)}) exceeds its "
            f"global limit for {flavor.name} ({gpus(own_global.limit_milli)})."
        )


def check_global_holds_pins(
    tenant: Tenant, flavor: ResourceFlavor, values: QuotaValues
) -> dict[str, list[str]]:
    """Errors when a global quota of `tenant` on `flavor` would no longer hold its pinned
    ones: their guarantees' sum above its guarantee, or a pinned limit above its limit."""
    pins = list(_pinned(tenant, flavor).select_related("cluster").order_by("cluster__name"))
    errors: dict[str, list[str]] = {}
    pinned_g = sum(q.guaranteed_milli for q in pins)
    if pinned_g > values.guaranteed_milli:
        terms = " + ".join(f"{q.cluster.name} {gpus(q.guaranteed_milli)}" for q in pins)
        errors["guaranteed_milli"] = [
            f"guaranteed ({gpus(values.guaranteed_milli)}) is below the guarantees of "
            f"'{tenant.slug}' pinned to clusters for {flavor.name}: {gpus(pinned_g)} ({terms})."
        ]
    over = [q for q in pins if q.limit_milli > values.limit_milli]
    if over:
        names = ", ".join(f"{q.cluster.name} {gpus(q.limit_milli)}" for q in over)
        errors["limit_milli"] = [
            f"limit ({gpus(values.limit_milli)}) is below pinned limits of '{tenant.slug}' "
            f"for {flavor.name}: {names}."
        ]
    return errors
