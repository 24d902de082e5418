"""Quota against use per tenant and flavor: what the portal's quota tables and the usage API
(`gantry usage`) show. Callers pass tenants already scoped by `tenants.access`."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass

from django.db.models import Exists, OuterRef, Q, Sum

from scheduler.core.quota import QuotaLedger, subtree_usage
from scheduler.models import Allocation, Cluster, Job, JobState
from scheduler.snapshot.translate import load_tenants
from tenants.models import Quota, ResourceFlavor, Tenant


@dataclass(frozen=True)
class QuotaRow:
    """``cluster``: the name of the cluster the quota is pinned to ("" for a global one),
    whose use is then the subtree's use of the flavor on that cluster's nodes. ``quota``
    False: the subtree holds GPUs of a flavor its tenant sets no quota on, which it can only
    borrow (guarantee 0, ``limit_milli`` None: no limit of its own, its ancestors' apply)."""

    tenant: Tenant
    flavor: ResourceFlavor
    guaranteed_milli: int
    limit_milli: int | None
    used_milli: int
    user_limit_milli: int | None = None
    cluster: str = ""
    quota: bool = True

    @property
    def used_pct(self) -> int:
        """Use as a share of the limit, for the bar (capped at 100)."""
        if self.limit_milli is None:
            return 0
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


# States in which a job holds GPUs charged to its tenant, or will be given them with no
# further decision: queued (and preempted, which returns to the queue) jobs count, or ten
# jobs submitted together would each see the guarantee free and borrow without approval.
CLAIMING_STATES = (
    JobState.QUEUED,
    JobState.ADMITTED,
    JobState.BINDING,
    JobState.RUNNING,
    JobState.PREEMPTED,
)


Claim = tuple[str, str, int]  # (tenant, flavor, milli-GPU)


def _path_chain(path: str) -> list[str]:
    """The paths of the tenant at ``path`` and of each ancestor: "/1/4/" -> "/1/4/", "/1/"."""
    ids = path.strip("/").split("/")
    return ["/" + "/".join(ids[:n]) + "/" for n in range(len(ids), 0, -1)]


def held_claims(where: Q | None = None, *, key: str = "job__tenant__path") -> list[Claim]:
    """The GPUs held now, as claims for `subtree_usage`: per tenant (`key`: its path, or
    its slug) and flavor, the milli-GPU of the active allocations (`where`) of jobs whose
    class counts against quota, on the flavor each replica landed on. One query."""
    rows = (
        Allocation.objects.filter(
            where or Q(), ended_at__isnull=True, job__priority_class__counts_against_quota=True
        )
        .values(key, "flavor")
        .annotate(milli=Sum("gpu_milli"))
        .values_list(key, "flavor", "milli")
        .order_by()
    )
    return [(tenant, flavor, milli or 0) for tenant, flavor, milli in rows]


def usage_by_tenant(
    tenants: list[Tenant],
    *,
    claiming: bool = False,
    any_flavor: Sequence[str] = (),
    exclude_job: int | None = None,
) -> dict[int, dict[str, int]]:
    """tenant id -> flavor name -> milli-GPU used in the tenant's subtree, as the engine
    charges it (`scheduler.core.quota.subtree_usage`): every active allocation of a job whose
    class counts against quota, on the flavor its replica landed on, from placement until
    its pods are gone (a preempted or finished job included, while its pods stop).

    With ``claiming`` (the approval rules), the subtree's jobs in `CLAIMING_STATES` that hold
    no allocation yet (queued, or preempted and back in the queue) count too: their flavor
    is not known, so each counts against every flavor it allows, or against each of
    ``any_flavor`` when it allows any; this errs towards asking for approval.
    ``exclude_job``: the job being judged, which is not its own usage. Two queries."""
    if not tenants:
        return {}
    subtree, subtree_jobs = Q(), Q()
    for tenant in tenants:
        subtree |= Q(job__tenant__path__startswith=tenant.path)
        subtree_jobs |= Q(tenant__path__startswith=tenant.path)
    if exclude_job is not None:
        subtree &= ~Q(job_id=exclude_job)
        subtree_jobs &= ~Q(pk=exclude_job)
    claims = held_claims(subtree)
    if claiming:
        waiting = (
            Job.objects.filter(
                subtree_jobs,
                state__in=CLAIMING_STATES,
                priority_class__counts_against_quota=True,
            )
            .exclude(Exists(Allocation.objects.filter(job=OuterRef("pk"), ended_at__isnull=True)))
            .values_list("tenant__path", "replicas", "gpu_milli_per_replica", "flavors")
        )
        for path, replicas, per_replica, flavors in waiting:
            claims += [(path, name, replicas * per_replica) for name in flavors or any_flavor]
    used = subtree_usage(claims, _path_chain)
    out: dict[int, dict[str, int]] = {t.pk: defaultdict(int) for t in tenants}
    by_path = {t.path: t.pk for t in tenants}
    for (path, flavor), milli in used.items():
        if path in by_path:
            out[by_path[path]][flavor] = milli
    return out


def usage_by_cluster(tenants: list[Tenant]) -> dict[int, dict[tuple[str, str], int]]:
    """tenant id -> (flavor, cluster name) -> milli-GPU its subtree holds on that cluster's
    nodes, as the engine charges quotas pinned there (a node without a cluster is the home
    cluster's). One query, two with the home cluster's name."""
    if not tenants:
        return {}
    subtree = Q()
    for tenant in tenants:
        subtree |= Q(job__tenant__path__startswith=tenant.path)
    home = ""
    rows = (
        Allocation.objects.filter(
            subtree, ended_at__isnull=True, job__priority_class__counts_against_quota=True
        )
        .values("job__tenant__path", "flavor", "node__cluster__name")
        .annotate(milli=Sum("gpu_milli"))
        .values_list("job__tenant__path", "flavor", "node__cluster__name", "milli")
        .order_by()
    )
    claims: list[tuple[str, tuple[str, str], int]] = []
    for path, flavor, cluster, milli in rows:
        if cluster is None and not home:
            home = Cluster.objects.filter(home=True).values_list("name", flat=True).first() or ""
        claims.append((path, (flavor, cluster or home), milli or 0))
    used: dict[tuple[str, tuple[str, str]], int] = defaultdict(int)
    for path, key, milli in claims:
        for node in _path_chain(path):
            used[(node, key)] += milli
    by_path = {t.path: t.pk for t in tenants}
    out: dict[int, dict[tuple[str, str], int]] = {t.pk: {} for t in tenants}
    for (path, key), milli in used.items():
        if path in by_path:
            out[by_path[path]][key] = milli
    return out


def quota_rows(tenants: list[Tenant]) -> list[QuotaRow]:
    """Quota with current use for each of `tenants` (already access-checked), tree order: a
    tenant's global quota of a flavor, then those pinned to clusters, by cluster name; and a
    row without quota (`QuotaRow.quota` False) for each flavor the tenant's subtree holds
    GPUs of while the tenant sets no quota on it (borrowed: hidden, the tables would show
    less in use than the dashboards and the bill)."""
    quotas = list(
        Quota.objects.filter(tenant__in=tenants).select_related("tenant", "flavor", "cluster")
    )
    used = usage_by_tenant(tenants)
    pinned = any(q.cluster_id is not None for q in quotas)
    on_cluster = usage_by_cluster(tenants) if pinned else {}
    return sorted(
        [*_quota_rows(quotas, used, on_cluster), *_unquoted_rows(tenants, quotas, used)],
        key=lambda r: (r.tenant.path, r.flavor.name, r.cluster),
    )


def _unquoted_rows(
    tenants: list[Tenant], quotas: Sequence[Quota], used: dict[int, dict[str, int]]
) -> list[QuotaRow]:
    """The rows of flavors held without a quota (see `quota_rows`). One query, when any."""
    quoted = {(q.tenant_id, q.flavor.name) for q in quotas}
    held = [
        (tenant, name, milli)
        for tenant in tenants
        for name, milli in used.get(tenant.pk, {}).items()
        if milli > 0 and (tenant.pk, name) not in quoted
    ]
    if not held:
        return []
    flavors = ResourceFlavor.objects.in_bulk({name for _, name, _ in held}, field_name="name")
    return [
        QuotaRow(tenant, flavors[name], 0, None, milli, quota=False)
        for tenant, name, milli in held
        if name in flavors
    ]


def _quota_rows(
    quotas: Sequence[Quota],
    used: dict[int, dict[str, int]],
    on_cluster: dict[int, dict[tuple[str, str], int]],
) -> list[QuotaRow]:
    return [
        QuotaRow(
            tenant=q.tenant,
            flavor=q.flavor,
            guaranteed_milli=q.guaranteed_milli,
            limit_milli=q.limit_milli,
            used_milli=(
                on_cluster.get(q.tenant_id, {}).get((q.flavor.name, q.cluster.name), 0)
                if q.cluster is not None
                else used.get(q.tenant_id, {}).get(q.flavor.name, 0)
            ),
            user_limit_milli=q.user_limit_milli,
            cluster=q.cluster.name if q.cluster is not None else "",
        )
        for q in quotas
    ]


def charged_ledger() -> tuple[QuotaLedger, list[str]]:
    """The engine's quota ledger over every tenant and flavor (the flavors any quota names or
    any allocation holds, sorted), charged with what is held now (`held_claims`) as a cycle
    would charge it. Three queries: tenants, quotas, allocations."""
    tenants, _slugs = load_tenants()
    charged = held_claims(key="job__tenant__slug")
    flavors = {f for t in tenants for f in t.quotas} | {flavor for _, flavor, _ in charged}
    ledger = QuotaLedger(tenants, sorted(flavors))
    for slug, flavor, milli in charged:
        if slug in ledger.tenants:
            ledger.charge(slug, "", flavor, milli or 0)
    return ledger, sorted(flavors)
