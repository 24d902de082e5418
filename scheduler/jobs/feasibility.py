"""Refuse at submit a job that can never run, saying why.

A job can never run on a flavor when no node of the inventory could hold it even empty
(``scheduler.core.fit``), or when its tenant's quotas never admit its gang: a limit up the
tree, the tenant's per-user cap, or the quota the tenant's tree holds on that flavor at all
(the engine's own ledger decides, with nothing running). It is refused when that holds for
every flavor it allows.

The inventory may grow (a cluster autoscaler, nodes still to join): with
``GANTRY_REFUSE_BEYOND_INVENTORY`` off, only quotas refuse, and a job no node holds is
queued; the engine's wait reason then says that nothing in the cluster can hold it today.
With no node known at all (a scheduler that has not yet listed the cluster), the inventory
is not judged either. A job without GPUs is judged against the part of a GPU node's CPU and
memory such jobs may hold (`placement.cpu_only_share` of the profile the leading daemon
recorded, else the built-in default; docs/engine.md, "Jobs without GPUs").
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

import numpy as np
from django.conf import settings
from rest_framework.exceptions import ValidationError

from scheduler.core import Profile, ProfileError
from scheduler.core.fit import Capacity, Misfit, closest, describe, misfit
from scheduler.core.quota import QuotaLedger, gpus
from scheduler.core.types import Device, Resources
from scheduler.core.types import Node as CoreNode
from scheduler.core.types import Quota as CoreQuota
from scheduler.core.types import Tenant as CoreTenant
from scheduler.models import GpuDevice, Job, Node, SchedulingProfileRecord
from tenants.models import JobType, Quota, ResourceFlavor, Tenant

RESOURCE_FIELDS = {
    "gpus",
    "gpu_milli",
    "mig_profile",
    "gpu_memory_mib",
    "cpu_milli",
    "memory_mib",
    "rdma",
}


def job_check_fits(*, job: Job, spec: dict[str, Any]) -> None:
    """Raise a ValidationError naming the fields (as the spec names them) when ``job`` can
    never run on any flavor it allows; return when it may."""
    res = Resources(
        job.gpu_milli_per_replica,
        job.gpu_memory_mib or 0,
        job.cpu_milli,
        job.memory_mib,
        spec["resources"].get("rdma") or 0,
    )
    gang = spec.get("min_replicas") or job.replicas
    nodes = _inventory(tuple(spec.get("pools") or ()))
    flavors = (
        list(job.flavors)
        or sorted({n.flavor for n in nodes if n.flavor})
        or list(ResourceFlavor.objects.values_list("name", flat=True))
    )
    judge_nodes = bool(nodes) and settings.GANTRY_REFUSE_BEYOND_INVENTORY
    if not flavors or (not judge_nodes and not job.priority_class.counts_against_quota):
        return
    share = _cpu_only_share() if judge_nodes and not res.gpu_milli else 1.0
    capacity = Capacity(nodes, today=False, cpu_only_share=share)
    flavor_of = np.array([n.flavor for n in nodes], dtype=object)
    misfits: list[Misfit] = []
    short: dict[str, list[str]] = defaultdict(list)
    for flavor in flavors:
        miss = misfit(capacity, flavor_of == flavor, res, gang, flavor) if judge_nodes else None
        if miss is not None:
            misfits.append(miss)
            continue
        why = _quota_short(job, flavor, res.gpu_milli, gang)
        if why is None:
            return  # this flavor may run it
        short[_quota_field(job, spec, why[0])].append(why[1])
    raise ValidationError(_errors(misfits, short, spec))


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
        CoreNode(r.name, r.flavor, tuple(devices[r.pk]), r.cpu_milli, r.memory_mib, r.rdma)
        for r in rows.only("name", "flavor", "cpu_milli", "memory_mib", "rdma")
    ]


def _quota_short(job: Job, flavor: str, per_replica: int, gang: int) -> tuple[bool, str] | None:
    """(whether one replica would pass, why) when the tenant's quotas never admit the gang
    on ``flavor`` with nothing running; None when they do."""
    need = per_replica * gang
    if not need or not job.priority_class.counts_against_quota:
        return None
    tenant, chain = job.tenant, job.tenant.ancestor_ids()
    rows = {
        q.tenant_id: q
        for q in Quota.objects.filter(
            flavor__name=flavor, tenant__path__startswith=f"/{chain[0]}/"
        ).select_related("tenant")
    }
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


def _ledger(tenant: Tenant, flavor: str, rows: dict[int, Quota]) -> QuotaLedger:
    """The engine's quota ledger over the tenant's tree, for ``flavor`` alone."""
    root = tenant.ancestor_ids()[0]
    tree = Tenant.objects.filter(path__startswith=f"/{root}/").values("id", "slug", "parent_id")
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


def _quota_field(job: Job, spec: dict[str, Any], one_fits: bool) -> str:
    """A quota that admits one replica but not the gang is about the replicas."""
    if one_fits:
        inference = job.job_type == JobType.INFERENCE and spec.get("min_replicas")
        return "min_replicas" if inference else "replicas"
    return _gpu_field(spec)


def _gpu_field(spec: dict[str, Any]) -> str:
    res = spec["resources"]
    if res.get("mig_profile"):
        return "mig_profile"
    return "gpu_milli" if res.get("gpu_milli") is not None else "gpus"


def _errors(
    misfits: list[Misfit], short: dict[str, list[str]], spec: dict[str, Any]
) -> dict[str, Any]:
    errors: dict[str, Any] = {}

    def add(field: str, message: str) -> None:
        if field in RESOURCE_FIELDS:
            errors.setdefault("resources", {}).setdefault(field, []).append(message)
        else:
            errors.setdefault(field, []).append(message)

    if misfits:
        field = closest(misfits).field
        if field == "gpus":
            field = _gpu_field(spec)
        add(field, f"no node in the cluster can hold this job: {describe(misfits)}.")
    for field, messages in short.items():
        add(field, "the quota never admits this job: " + "; ".join(messages) + ".")
    return errors
