"""The inventory and the quotas as the engine judges a job that can never run: the door's
half of `scheduler.jobs.feasibility` (rows in, the engine's fit and quota ledger, answers out
in the spec's words).

`job_misfit` asks ``scheduler.core.fit`` whether any node of a flavor could hold the job even
empty; `quota_short` asks the engine's ledger, with nothing running, whether the tenant's
quotas ever admit its gang.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from typing import Any

import numpy as np

from common.db.shared_reads import shared
from scheduler.clusters.selectors import cluster_labels
from scheduler.core import Profile, ProfileError
from scheduler.core.clusters import CLUSTER_LABEL, REGION_LABEL, resolve_placement
from scheduler.core.fit import Capacity, Misfit, closest, describe, misfit_in_one_cluster
from scheduler.core.quota import QuotaLedger, gpus
from scheduler.core.types import Device, Resources
from scheduler.core.types import Node as CoreNode
from scheduler.core.types import Quota as CoreQuota
from scheduler.core.types import Tenant as CoreTenant
from scheduler.models import GpuDevice, Job, Node, SchedulingProfileRecord
from tenants.models import Quota, Tenant


@dataclass
class Inventory:
    """Every node the cluster lists (in the pools asked), whatever its health today."""

    nodes: list[CoreNode]

    @property
    def flavors(self) -> list[str]:
        return sorted({n.flavor for n in self.nodes if n.flavor})

    def __bool__(self) -> bool:
        return bool(self.nodes)


@shared
def inventory(pools: tuple[str, ...]) -> Inventory:
    return Inventory(_inventory(pools))


@dataclass
class Misfits:
    """Why no node of some flavors could hold a job: the closest miss, in the spec's words."""

    found: list[Misfit]

    def __bool__(self) -> bool:
        return bool(self.found)

    @property
    def field(self) -> str:
        return closest(self.found).field

    @property
    def description(self) -> str:
        return describe(self.found)


class FitJudge:
    """Whether one replica of a job fits on a node of each flavor of the inventory, empty."""

    def __init__(self, job: Job, spec: dict[str, Any], inv: Inventory, *, judge_nodes: bool):
        self.res = Resources(
            job.gpu_milli_per_replica,
            job.gpu_memory_mib or 0,
            job.cpu_milli,
            job.memory_mib,
            spec["resources"].get("rdma") or 0,
        )
        self.gang = spec.get("min_replicas") or job.replicas
        share = _cpu_only_share() if judge_nodes and not self.res.gpu_milli else 1.0
        self.capacity = Capacity(inv.nodes, today=False, cpu_only_share=share)
        self.flavor_of = np.array([n.flavor for n in inv.nodes], dtype=object)
        # Several clusters (docs/multicluster.md): the job runs in one, within its placement.
        cluster = [n.labels.get(CLUSTER_LABEL, "") for n in inv.nodes]
        region = [n.labels.get(REGION_LABEL, "") for n in inv.nodes]
        names = {name: code for code, name in enumerate(sorted(set(cluster)))}
        self.cluster_of = np.array([names[c] for c in cluster], dtype=np.int64)
        placement = spec.get("placement") or {}
        self.within = np.ones(len(inv.nodes), dtype=np.bool_)
        # The clusters' labels are read only for a placement that names clusters (by name or
        # label): a submit without one reads nothing more.
        named = placement.get("clusters") or placement.get("cluster_labels")
        required = resolve_placement(placement, cluster_labels())[0] if named else ()
        if required:
            self.within &= np.isin(np.array(cluster, dtype=object), required)
        if placement.get("regions"):
            self.within &= np.isin(np.array(region, dtype=object), placement["regions"])
        self.misses = Misfits([])

    def misses_on(self, flavor: str) -> bool:
        """True (and the miss kept) when no node of ``flavor`` (in the job's clusters and
        regions) could hold the job, a gang within one cluster."""
        nodes = (self.flavor_of == flavor) & self.within
        miss = misfit_in_one_cluster(
            self.capacity, nodes, self.cluster_of, self.res, self.gang, flavor
        )
        if miss is not None:
            self.misses.found.append(miss)
        return miss is not None


def _cpu_only_share() -> float:
    """What jobs without GPUs may hold of a GPU node, as the profile in force says."""
    document = SchedulingProfileRecord.objects.filter(pk=1).values_list("document", flat=True)
    try:
        return Profile.from_document(document.first() or Profile().to_document()).cpu_only_share
    except ProfileError:  # recorded by another version of the code
        return Profile().cpu_only_share


def _inventory(pools: tuple[str, ...]) -> list[CoreNode]:
    """Every node the cluster lists, whatever its health today: the inventory."""
    rows = Node.objects.filter(present=True)
    if pools:
        rows = rows.filter(pool__in=pools)
    devices: dict[int, list[Device]] = defaultdict(list)
    for node_id, index, memory in GpuDevice.objects.filter(node__in=rows).values_list(
        "node_id", "index", "memory_mib"
    ):
        devices[node_id].append(Device(index, memory))
    return [
        CoreNode(
            r.name,
            r.flavor,
            tuple(devices[r.pk]),
            r.cpu_milli,
            r.memory_mib,
            r.rdma,
            labels=r.labels,
        )
        for r in rows.only("name", "flavor", "cpu_milli", "memory_mib", "rdma", "labels")
    ]


def quota_short(job: Job, flavor: str, per_replica: int, gang: int) -> tuple[bool, str] | None:
    """(whether one replica would pass, why) when the tenant's quotas never admit the gang
    on ``flavor`` with nothing running; None when they do."""
    need = per_replica * gang
    if not need or not job.priority_class.counts_against_quota:
        return None
    tenant, chain = job.tenant, job.tenant.ancestor_ids()
    rows = _quotas_in_tree(flavor, chain[0])
    own = rows.get(tenant.pk)
    if own is not None and own.user_limit_milli is not None and need > own.user_limit_milli:
        return per_replica <= own.user_limit_milli, (
            f"one user of {tenant.slug} may hold at most {gpus(own.user_limit_milli)} "
            f"{flavor}; the job needs {gpus(need)} at once"
        )
    for tenant_id in reversed(chain):
        quota = rows.get(tenant_id)
        if quota is not None and need > quota.limit_milli:
            return per_replica <= quota.limit_milli, (
                f"{quota.tenant.slug} may use at most {gpus(quota.limit_milli)} {flavor} "
                f"(its limit); the job needs {gpus(need)} at once"
            )
    ledger = _ledger(tenant, flavor, rows)
    if ledger.check(tenant.slug, "", flavor, need) is None:
        return None
    held = "no quota on" if not rows else "too little quota on"
    return ledger.check(tenant.slug, "", flavor, per_replica) is None, (
        f"{tenant.slug}'s organisation holds {held} {flavor} for the {gpus(need)} GPUs "
        "the job needs at once"
    )


@shared
def _quotas_in_tree(flavor: str, root: int) -> dict[int, Quota]:
    """The cluster-wide quotas on ``flavor`` of the tree under ``root``, by tenant id."""
    return {
        q.tenant_id: q
        for q in Quota.objects.filter(
            flavor__name=flavor, tenant__path__startswith=f"/{root}/", cluster__isnull=True
        ).select_related("tenant")
    }


@shared
def _tree(root: int) -> list[dict[str, Any]]:
    """The id, slug and parent of every tenant of the tree under ``root``."""
    rows = Tenant.objects.filter(path__startswith=f"/{root}/").values("id", "slug", "parent_id")
    return [dict(row) for row in rows]


def _ledger(tenant: Tenant, flavor: str, rows: dict[int, Quota]) -> QuotaLedger:
    """The engine's quota ledger over the tenant's tree, for ``flavor`` alone."""
    tree = _tree(tenant.ancestor_ids()[0])
    slugs = {t["id"]: t["slug"] for t in tree}
    core = tuple(
        CoreTenant(
            t["slug"],
            slugs.get(t["parent_id"]),
            {
                flavor: CoreQuota(
                    rows[t["id"]].guaranteed_milli,
                    rows[t["id"]].limit_milli,
                    rows[t["id"]].lend_limit_milli,
                )
            }
            if t["id"] in rows
            else {},
        )
        for t in tree
    )
    return QuotaLedger(core, [flavor])
