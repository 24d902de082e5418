"""Quota against use per tenant and flavor: what the portal's quota tables and the usage API
(`gantry usage`) show. Callers pass tenants already scoped by `tenants.access`."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

from django.db.models import Q, Sum

from scheduler.models import Allocation
from tenants.models import Quota, ResourceFlavor, Tenant


@dataclass(frozen=True)
class QuotaRow:
    tenant: Tenant
    flavor: ResourceFlavor
    guaranteed_milli: int
    limit_milli: int
    used_milli: int
    user_limit_milli: int | None = None

    @property
    def used_pct(self) -> int:
        """Use as a share of the limit, for the bar (capped at 100)."""
        if not self.limit_milli:
            return 100 if self.used_milli else 0
        return min(100, round(100 * self.used_milli / self.limit_milli))

    @property
    def guaranteed_pct(self) -> int:
        if not self.limit_milli:
            return 0
        return min(100, round(100 * self.guaranteed_milli / self.limit_milli))

    @property
    def borrowing(self) -> bool:
        return self.used_milli > self.guaranteed_milli


def usage_by_tenant(tenants: list[Tenant]) -> dict[int, dict[str, int]]:
    """tenant id -> flavor name -> milli-GPU held in the tenant's subtree: the active
    allocations, on the flavor each replica landed on. This is what the scheduler charges:
    a job's pods hold their share from placement until they are gone (a preempted or
    finished job included, while its pods stop). One query for all tenants."""
    if not tenants:
        return {}
    subtree = Q()
    for tenant in tenants:
        subtree |= Q(job__tenant__path__startswith=tenant.path)
    rows = (
        Allocation.objects.filter(subtree, ended_at__isnull=True)
        .values("job__tenant__path", "flavor")
        .annotate(milli=Sum("gpu_milli"))
        .values_list("job__tenant__path", "flavor", "milli")
    )
    used: dict[int, dict[str, int]] = {t.pk: defaultdict(int) for t in tenants}
    for path, flavor, milli in rows:
        for tenant in tenants:
            if path.startswith(tenant.path):
                used[tenant.pk][flavor] += milli
    return used


def quota_rows(tenants: list[Tenant]) -> list[QuotaRow]:
    """Quota with current use for each of `tenants` (already access-checked), tree order."""
    quotas = Quota.objects.filter(tenant__in=tenants).select_related("tenant", "flavor")
    used = usage_by_tenant(tenants)
    return [
        QuotaRow(
            tenant=q.tenant,
            flavor=q.flavor,
            guaranteed_milli=q.guaranteed_milli,
            limit_milli=q.limit_milli,
            used_milli=used.get(q.tenant_id, {}).get(q.flavor.name, 0),
            user_limit_milli=q.user_limit_milli,
        )
        for q in sorted(quotas, key=lambda q: (q.tenant.path, q.flavor.name))
    ]
