"""Quota validation: a quota must fit its parent's and hold its children's.

A tenant without quota on a flavor runs there by borrowing only, and has nothing to give its
children: beneath it only a quota of 0/0 (no borrowing either) may be set.

The checks read the parent's and children's rows, so `quota_set` calls them while holding a
row lock on the parent's quota: two siblings raised at once cannot both squeeze in.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from django.core.exceptions import ValidationError

from tenants.models import Quota, ResourceFlavor, Tenant


def gpus(milli: int) -> str:
    """Milli-GPU as people say it: 16000 -> '16 GPUs', 2500 -> '2.5 GPUs', 1000 -> '1 GPU'."""
    value = milli / 1000
    text = f"{value:g}"
    return f"{text} GPU" if value == 1 else f"{text} GPUs"


@dataclass(frozen=True)
class QuotaValues:
    guaranteed_milli: int
    limit_milli: int
    lend_limit_milli: int | None
    weight: float
    user_limit_milli: int | None = None


def check_own_bounds(tenant: Tenant, values: QuotaValues) -> dict[str, list[str]]:
    errors: dict[str, list[str]] = {}
    if values.limit_milli < values.guaranteed_milli:
        errors["limit_milli"] = [
            f"the limit of '{tenant.slug}' ({gpus(values.limit_milli)}) is below its guaranteed "
            f"({gpus(values.guaranteed_milli)}); the limit includes the guarantee."
        ]
    if values.lend_limit_milli is not None and values.lend_limit_milli > values.guaranteed_milli:
        errors["lend_limit_milli"] = [
            f"the lend_limit of '{tenant.slug}' ({gpus(values.lend_limit_milli)}) exceeds its "
            f"guaranteed ({gpus(values.guaranteed_milli)}); only the guarantee can be lent."
        ]
    if values.user_limit_milli is not None and values.user_limit_milli > values.limit_milli:
        errors["user_limit_milli"] = [
            f"the user_limit of '{tenant.slug}' ({gpus(values.user_limit_milli)}) exceeds its "
            f"limit ({gpus(values.limit_milli)})."
        ]
    if values.weight <= 0:
        errors["weight"] = [
            f"the weight of '{tenant.slug}' must be above 0, got {values.weight:g}."
        ]
    return errors


def check_against_parent(
    tenant: Tenant,
    flavor: ResourceFlavor,
    values: QuotaValues,
    parent_quota: Quota | None,
    *,
    reveal_parent: bool = True,
) -> dict[str, list[str]]:
    """Errors against the parent's quota. Without `reveal_parent` (a team admin asking for
    their own team's quota, who cannot see the parent) they name no figure of the parent or
    of the siblings: their guarantees belong to subtrees the asker does not see."""
    if tenant.parent_id is None:
        return {}
    parent = tenant.parent
    assert parent is not None
    if parent_quota is None:
        return _below_no_quota(tenant, parent, flavor, values)
    if not reveal_parent:
        return _against_unseen_parent(tenant, parent, flavor, values, parent_quota)
    errors: dict[str, list[str]] = {}
    siblings = (
        Quota.objects.filter(tenant__parent=parent, flavor=flavor, cluster__isnull=True)
        .exclude(tenant=tenant)
        .select_related("tenant")
        .order_by("tenant__slug")
    )
    parts = [(q.tenant.slug, q.guaranteed_milli) for q in siblings if q.guaranteed_milli]
    total = values.guaranteed_milli + sum(m for _, m in parts)
    if total > parent_quota.guaranteed_milli:
        terms = " + ".join(
            f"{slug} {gpus(m)}" for slug, m in [(tenant.slug, values.guaranteed_milli), *parts]
        )
        errors["guaranteed_milli"] = [
            f"the guarantees of the children of '{parent.slug}' for {flavor.name} would sum to "
            f"{gpus(total)} ({terms}), above the parent's guarantee of "
            f"{gpus(parent_quota.guaranteed_milli)}."
        ]
    if values.limit_milli > parent_quota.limit_milli:
        errors["limit_milli"] = [
            f"the limit of '{tenant.slug}' ({gpus(values.limit_milli)}) exceeds the limit of "
            f"the parent '{parent.slug}' for {flavor.name} ({gpus(parent_quota.limit_milli)})."
        ]
    return errors


def _against_unseen_parent(
    tenant: Tenant, parent: Tenant, flavor: ResourceFlavor, values: QuotaValues, parent_quota: Quota
) -> dict[str, list[str]]:
    errors: dict[str, list[str]] = {}
    siblings = Quota.objects.filter(
        tenant__parent=parent, flavor=flavor, cluster__isnull=True
    ).exclude(tenant=tenant)
    taken = sum(siblings.values_list("guaranteed_milli", flat=True))
    if values.guaranteed_milli + taken > parent_quota.guaranteed_milli:
        errors["guaranteed_milli"] = [
            f"'{tenant.slug}' asks for {gpus(values.guaranteed_milli)} guaranteed, more than "
            f"'{parent.slug}' has left to guarantee for {flavor.name}; ask a smaller guarantee "
            f"or an admin of '{parent.slug}'."
        ]
    if values.limit_milli > parent_quota.limit_milli:
        errors["limit_milli"] = [
            f"'{tenant.slug}' asks for a limit of {gpus(values.limit_milli)}, above the limit "
            f"of '{parent.slug}' for {flavor.name}; ask a smaller limit or an admin of "
            f"'{parent.slug}'."
        ]
    return errors


def _below_no_quota(
    tenant: Tenant, parent: Tenant, flavor: ResourceFlavor, values: QuotaValues
) -> dict[str, list[str]]:
    """A tenant without quota on a flavor runs there by borrowing only (as a Kueue
    ClusterQueue with nominalQuota 0), and so do its children: it has nothing to hand down.
    Only a quota of 0/0, which keeps the child from borrowing that flavor, may be set."""
    why = (
        f"the parent '{parent.slug}' holds no {flavor.name} quota, so it has none to give: "
        f"'{tenant.slug}' may only borrow idle {flavor.name}, as its parent does (a limit of 0 "
        f"forbids even that). Give '{parent.slug}' a quota for {flavor.name} first."
    )
    errors: dict[str, list[str]] = {}
    if values.guaranteed_milli:
        errors["guaranteed_milli"] = [
            f"'{tenant.slug}' asks for {gpus(values.guaranteed_milli)} guaranteed, but {why}"
        ]
    if values.limit_milli:
        errors["limit_milli"] = [
            f"'{tenant.slug}' asks for a limit of {gpus(values.limit_milli)}, but {why}"
        ]
    return errors


def check_against_children(
    tenant: Tenant, flavor: ResourceFlavor, values: QuotaValues, cluster: Any = None
) -> dict[str, list[str]]:
    """Errors when `values` would no longer hold the children's quotas of `tenant` for
    `flavor`: their guarantees' sum above its guarantee, or a child's limit above its limit.
    With `cluster`, the children's pins on that cluster against `tenant`'s pin there
    (`tenants.quotas.pins`); without, their global quotas. Names the children."""
    rows = Quota.objects.filter(tenant__parent=tenant, flavor=flavor)
    rows = rows.filter(cluster__isnull=True) if cluster is None else rows.filter(cluster=cluster)
    children = list(rows.select_related("tenant").order_by("tenant__slug"))
    where = "" if cluster is None else f" on cluster {cluster.name}"
    errors: dict[str, list[str]] = {}
    total = sum(q.guaranteed_milli for q in children)
    if total > values.guaranteed_milli:
        terms = " + ".join(f"{q.tenant.slug} {gpus(q.guaranteed_milli)}" for q in children)
        errors["guaranteed_milli"] = [
            f"guaranteed ({gpus(values.guaranteed_milli)}) is below what the children of "
            f"'{tenant.slug}' are guaranteed{where} for {flavor.name}: {gpus(total)} ({terms})."
        ]
    over = [q for q in children if q.limit_milli > values.limit_milli]
    if over:
        names = ", ".join(f"{q.tenant.slug} {gpus(q.limit_milli)}" for q in over)
        whose = (
            f"the limit of children of '{tenant.slug}'"
            if cluster is None
            else f"the limits the children of '{tenant.slug}' pin{where}"
        )
        errors["limit_milli"] = [
            f"limit ({gpus(values.limit_milli)}) is below {whose} for {flavor.name}: {names}."
        ]
    return errors


def validate_quota(
    tenant: Tenant,
    flavor: ResourceFlavor,
    values: QuotaValues,
    parent_quota: Quota | None,
    *,
    reveal_parent: bool = True,
) -> None:
    """Raise ValidationError (field -> messages) when the quota breaks a rule of the tree.
    `reveal_parent=False` words the errors against the parent without its or the siblings'
    figures (for a requester who cannot see them)."""
    errors = check_own_bounds(tenant, values)
    against_parent = check_against_parent(
        tenant, flavor, values, parent_quota, reveal_parent=reveal_parent
    )
    for field_name, messages in against_parent.items():
        errors.setdefault(field_name, []).extend(messages)
    for field_name, messages in check_against_children(tenant, flavor, values).items():
        errors.setdefault(field_name, []).extend(messages)
    if errors:
        raise ValidationError(errors)
