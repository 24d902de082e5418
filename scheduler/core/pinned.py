"""Quotas pinned to a cluster: where a tenant's guarantee and limit of a flavor hold.

A quota pinned to cluster C (``Tenant.pinned``, key ``pinned_key(flavor, C)``) holds only for
C's nodes; a global quota holds across every cluster. The ledger charges each allocation of
the flavor on C's nodes to the pinned key as well as to the flavor (``charge``), so:

- **Limits.** A pinned limit caps the use of the tenant's subtree on C's nodes. A job whose
  gang would take a tree node past its limit on C is not placed on C (``mask``); when that
  leaves none of the clusters the job may use, it waits on quota (``verdict``).
- **Guarantees.** Pinned guarantees count inside the global one (at most its sum: the tenants
  app refuses more). The part of the global guarantee not pinned anywhere floats: it holds
  in any cluster. A job within its tenant's global guarantee that the floating part no longer
  covers needs the pinned guarantee, and is placed only in a cluster where it stays within
  it (``guaranteed_in``). The floating part is used first, wherever the job fits best.
- **Reclaim per cluster.** A job whose tenant stays within its pinned guarantee on C
  (``owed_in``) may reclaim room on C from any tenant that uses C beyond its own pinned
  guarantee there (``excess``: a tenant that pins nothing on C uses all of it beyond), as a
  job within a global guarantee reclaims from borrowers. Such a victim frees room only: it
  is never stopped to free quota while its tenant stays within its global guarantee.

Only the job's own tenant's pinned guarantees restrict where it runs; every pinned limit up
its chain does. Pure: no Django, no I/O.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from scheduler.core.quota import QuotaLedger, QuotaVerdict, gpus, pinned_key
from scheduler.core.tentative import BoolArray, ClusterState
from scheduler.core.types import JobRequest, ReplicaAssignment


def charge(
    ledger: QuotaLedger,
    state: ClusterState,
    job: JobRequest,
    flavor: str,
    assignments: Sequence[ReplicaAssignment],
    sign: int,
) -> None:
    """Charge (+1) or refund (-1) ``assignments`` to the pinned keys of their nodes'
    clusters; nothing when no quota pins ``flavor``."""
    clusters = ledger.pinned.get(flavor)
    if not clusters:
        return
    for a in assignments:
        key = clusters.get(cluster_of(state, a.node))
        if key is not None:
            ledger.charge(job.tenant, job.user, key, sign * a.gpu_milli)


def cluster_of(state: ClusterState, node: str) -> str:
    """The cluster of a node of the state ("" when unlabelled or unknown)."""
    i = state.index.get(node)
    if i is None:
        return ""
    code = int(state.cluster[i])
    return state.cluster_names[code] if code >= 0 else ""


def over_limit(ledger: QuotaLedger, tenant: str, flavor: str, milli: int) -> dict[str, str]:
    """Cluster -> why: the clusters where ``milli`` more of ``flavor`` would take a node of
    ``tenant``'s chain past its pinned limit there (the first such rule per cluster)."""
    out: dict[str, str] = {}
    for node, cluster, quota in ledger.pins(tenant, flavor):
        if cluster in out or quota.limit is None:
            continue
        used = ledger.usage[(node, pinned_key(flavor, cluster))]
        if used + milli > quota.limit:
            out[cluster] = (
                f"quota: {node} has {gpus(used)} of its {flavor} limit of {gpus(quota.limit)} "
                f"on cluster {cluster} in use; this job needs {gpus(milli)}"
            )
    return out


def guaranteed_in(ledger: QuotaLedger, tenant: str, flavor: str, milli: int) -> tuple[str, ...]:
    """The clusters a job of ``milli`` of ``tenant`` must run in to stay within its
    guarantee, when it needs a pinned one; () when it does not (it borrows, or the floating
    guarantee covers it, or the tenant pins no guarantee of ``flavor``)."""
    own = [(c, q) for node, c, q in ledger.pins(tenant, flavor) if node == tenant]
    pinned_total = sum(q.guaranteed for _, q in own)
    if not pinned_total or not ledger.within_guarantee_after(tenant, flavor, milli):
        return ()
    used = ledger.usage
    covered = 0  # use within the pinned guarantees, cluster by cluster
    for cluster, quota in own:
        covered += min(used[(tenant, pinned_key(flavor, cluster))], quota.guaranteed)
    floating = ledger.guarantee(tenant, flavor) - pinned_total
    if used[(tenant, flavor)] - covered + milli <= floating:
        return ()
    return tuple(
        c
        for c, q in own
        if q.guaranteed and used[(tenant, pinned_key(flavor, c))] + milli <= q.guaranteed
    )


def owed_in(ledger: QuotaLedger, tenant: str, flavor: str, milli: int) -> tuple[str, ...]:
    """The clusters where ``tenant`` stays within its own pinned guarantee with ``milli``
    more (and within its global one): where a job of it may reclaim from tenants that use
    the cluster beyond their own pinned guarantee (``excess``), floating guarantee or not."""
    if not ledger.within_guarantee_after(tenant, flavor, milli):
        return ()
    used = ledger.usage
    return tuple(
        c
        for node, c, q in ledger.pins(tenant, flavor)
        if node == tenant
        and q.guaranteed
        and used[(tenant, pinned_key(flavor, c))] + milli <= q.guaranteed
    )


def excess(ledger: QuotaLedger, tenant: str, flavor: str, cluster: str) -> int:
    """Milli-GPU of ``flavor`` ``tenant`` uses on ``cluster`` beyond its pinned guarantee
    there (all it uses there when it pins none); 0 where no quota pins the flavor there."""
    key = ledger.pinned.get(flavor, {}).get(cluster)
    if key is None:
        return 0
    return max(0, ledger.usage[(tenant, key)] - ledger.guarantee(tenant, key))


def mask(
    ledger: QuotaLedger, state: ClusterState, job: JobRequest, flavor: str, milli: int
) -> BoolArray | None:
    """The nodes a placement of ``milli`` of ``job`` on ``flavor`` may use by its tenant's
    pinned quotas; None when they leave every node."""
    if not ledger.pins(job.tenant, flavor):
        return None
    barred = over_limit(ledger, job.tenant, flavor, milli)
    only = guaranteed_in(ledger, job.tenant, flavor, milli)
    if not barred and not only:
        return None
    names = state.cluster_names
    codes = [names.index(c) for c in (only or names) if c in names and c not in barred]
    allowed = np.isin(state.cluster, codes)
    if not only:
        allowed |= state.cluster < 0  # unlabelled nodes: a cluster no quota can pin
    out: BoolArray = allowed | (state.flavor != state.flavor_code(flavor))
    return out


def verdict(
    ledger: QuotaLedger, state: ClusterState, job: JobRequest, flavor: str, milli: int
) -> QuotaVerdict | None:
    """A quota verdict when the pinned limits bar every cluster where ``job`` could run on
    ``flavor`` (its required clusters and regions, pools and tolerations)."""
    if not ledger.pins(job.tenant, flavor):
        return None
    barred = over_limit(ledger, job.tenant, flavor, milli)
    if not barred:
        return None
    static = state.static_mask(flavor, job.pools, job.tolerations, job.clusters, job.regions)
    codes = {int(c) for c in np.unique(state.cluster[static])}
    open_ = [c for c in codes if c < 0 or state.cluster_names[c] not in barred]
    if open_ or not codes:
        return None
    return QuotaVerdict(job.tenant, "; ".join(barred[c] for c in sorted(barred)))
