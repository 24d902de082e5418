"""The order in which the workload controller queues what it found held in one pass (issue 37).

Queueing one object is a whole submission (`job_submit`: quotas, approvals, budgets, estimates,
audit), tens of milliseconds, so a burst of objects created at once is queued over seconds. The
queue would serve them by priority anyway; the door does the same: in one pass, the objects not
queued yet go highest priority class first, then oldest first (creation time, then name), so a
high-priority Job is not left behind a burst of low ones while each of those is submitted. The
class is the one the object's `gantry.io/priority-class` label names, else the default its
project's tenant gives its job type (the `gantry.io/job-type` label; "training" for a Job of
several pods, else "batch", as `scheduler.workloads.shape` reads them), else the platform's.
An object whose class cannot be found (a name no class has: its submission refuses it) counts as
the lowest.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from scheduler.workloads.kinds import at
from scheduler.workloads.shape import LABEL_JOB_TYPE, LABEL_PRIORITY
from tenants.models import PriorityClass, Project

Obj = dict[str, Any]
LOWEST = -(2**31)


def queue_order(items: Sequence[tuple[str, Obj]], value: Callable[[Obj], int]) -> list[str]:
    """The uids of `items` (uid, the workload's first object) highest `value` first, then by
    creation time, then by name."""

    def key(item: tuple[str, Obj]) -> tuple[int, str, str]:
        obj = item[1]
        created = str(at(obj, ("metadata", "creationTimestamp")) or "")
        return (-value(obj), created, str(at(obj, ("metadata", "name")) or ""))

    return [uid for uid, _ in sorted(items, key=key)]


def job_type(obj: Obj) -> str:
    labels = at(obj, ("metadata", "labels")) or {}
    if labels.get(LABEL_JOB_TYPE):
        return str(labels[LABEL_JOB_TYPE])
    parallelism = at(obj, ("spec", "parallelism"))
    return "training" if isinstance(parallelism, int) and parallelism > 1 else "batch"


def class_values(objects: Sequence[Obj]) -> Callable[[Obj], int]:
    """The value of each object's priority class, read with a few queries for them all."""
    from tenants.services import priority_default_for

    named = {
        str(label)
        for obj in objects
        if (label := (at(obj, ("metadata", "labels")) or {}).get(LABEL_PRIORITY))
    }
    values: Mapping[str, int] = dict(
        PriorityClass.objects.filter(name__in=named).values_list("name", "value")
    )
    namespaces = {str(at(obj, ("metadata", "namespace"))) for obj in objects}
    tenants = {
        p.namespace: p.tenant
        for p in Project.objects.filter(namespace__in=namespaces).select_related("tenant")
    }
    defaults: dict[tuple[str, str], int] = {}

    def value(obj: Obj) -> int:
        label = (at(obj, ("metadata", "labels")) or {}).get(LABEL_PRIORITY)
        if label:
            return values.get(str(label), LOWEST)
        namespace, kind = str(at(obj, ("metadata", "namespace"))), job_type(obj)
        if (namespace, kind) not in defaults:
            tenant = tenants.get(namespace)
            found = priority_default_for(tenant=tenant, job_type=kind) if tenant else None
            defaults[(namespace, kind)] = found.value if found else LOWEST
        return defaults[(namespace, kind)]

    return value
