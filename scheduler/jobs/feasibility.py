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

from django.conf import settings
from rest_framework.exceptions import ValidationError

from scheduler.models import Job
from scheduler.snapshot.feasibility import FitJudge, Misfits, inventory, quota_short
from tenants.models import JobType
from tenants.selectors import flavor_names

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
    nodes = inventory(tuple(spec.get("pools") or ()))
    flavors = list(job.flavors) or nodes.flavors or flavor_names()
    judge_nodes = bool(nodes) and settings.GANTRY_REFUSE_BEYOND_INVENTORY
    if not flavors or (not judge_nodes and not job.priority_class.counts_against_quota):
        return
    fits = FitJudge(job, spec, nodes, judge_nodes=judge_nodes)
    short: dict[str, list[str]] = defaultdict(list)
    for flavor in flavors:
        if judge_nodes and fits.misses_on(flavor):
            continue
        why = quota_short(job, flavor, fits.res.gpu_milli, fits.gang)
        if why is None:
            return  # this flavor may run it
        short[_quota_field(job, spec, why[0])].append(why[1])
    raise ValidationError(_errors(fits.misses, short, spec))


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


def _errors(misfits: Misfits, short: dict[str, list[str]], spec: dict[str, Any]) -> dict[str, Any]:
    errors: dict[str, Any] = {}

    def add(field: str, message: str) -> None:
        if field in RESOURCE_FIELDS:
            errors.setdefault("resources", {}).setdefault(field, []).append(message)
        else:
            errors.setdefault(field, []).append(message)

    if misfits:
        field = misfits.field
        if field == "gpus":
            field = _gpu_field(spec)
        add(field, f"no node in the cluster can hold this job: {misfits.description}.")
    for field, messages in short.items():
        add(field, "the quota never admits this job: " + "; ".join(messages) + ".")
    return errors
