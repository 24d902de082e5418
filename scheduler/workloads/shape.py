"""What a held workload asks for, as the job spec Gantry queues it with (issue 37).

The controller mirrors each held object into a Gantry job submitted exactly like a portal or
API submission (`scheduler.jobs.services.job_submit`), so quotas, approvals, budgets and
billing apply unchanged. This module reads the object into that payload, or says plainly why
it cannot be queued (the controller writes the refusal as an event on the object):

- a plain Pod is one replica; the pods of a pod group (label `gantry.io/pod-group`, size in
  `gantry.io/pod-group-size`) are the replicas of one gang, in name order, once all of the
  group's pods exist, and they must ask for the same resources (a gang's replicas are alike);
- resources per replica are what the pod's containers request (limits where a request is
  absent, as the API server defaults it): GPUs from the device resource's limits, CPU and
  memory from requests; an init container's larger request counts, as kube-scheduler counts it;
- labels the user may set: `gantry.io/priority-class`, `gantry.io/job-type`, `gantry.io/flavor`;
  the pod's `activeDeadlineSeconds` is the job's maximum runtime.

The image and command recorded are the first container's (the pods themselves run what the
user wrote; the record is what the portal shows).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from decimal import Decimal, InvalidOperation
from typing import Any

from kubernetes.utils.quantity import parse_quantity

from scheduler.workloads.kinds import at
from scheduler.workloads.mutate import LABEL_POD_GROUP, LABEL_POD_GROUP_SIZE

Obj = dict[str, Any]

LABEL_PRIORITY = "gantry.io/priority-class"
LABEL_JOB_TYPE = "gantry.io/job-type"
LABEL_FLAVOR = "gantry.io/flavor"
ENTRYPOINT = "(the image's entrypoint)"
MAX_GROUP = 1024  # the most replicas a job may have (the job spec's own limit)


class Refused(ValueError):
    """The object cannot be queued as it is; the message says why, for the user."""


@dataclass(frozen=True)
class Shaped:
    """The payload to submit and the pods that are its replicas (replica i is `pods[i]`)."""

    payload: dict[str, Any]
    pods: tuple[str, ...] = field(default=())


def quantity(value: Any) -> Decimal:
    """A Kubernetes quantity ("8", "500m", "64Gi") as a Decimal; a malformed or negative one
    is Refused (the API server refuses such a pod on its own, so only a bug gets here)."""
    try:
        parsed = parse_quantity(value)  # type: ignore[no-untyped-call]
    except (ValueError, InvalidOperation, TypeError):
        raise Refused(f"{value!r} is not a quantity") from None
    if parsed < 0:
        raise Refused(f"{value!r} is not a quantity")
    return Decimal(parsed)


def _resources(container: Obj, gpu_resource: str) -> tuple[int, Decimal, Decimal]:
    """(GPUs, CPU cores, memory bytes) one container asks for."""
    requests = at(container, ("resources", "requests")) or {}
    limits = at(container, ("resources", "limits")) or {}

    def amount(name: str) -> Decimal:
        value = requests.get(name, limits.get(name))
        return Decimal(0) if value is None else quantity(value)

    gpus = quantity(limits.get(gpu_resource, requests.get(gpu_resource, 0)))
    if gpus != gpus.to_integral_value():
        raise Refused(f"{gpu_resource} must be a whole number, got {gpus}")
    return int(gpus), amount("cpu"), amount("memory")


def pod_resources(pod: Obj, gpu_resource: str = "nvidia.com/gpu") -> tuple[int, int, int]:
    """(GPUs, milli-CPU, MiB) a pod asks for: its containers' sum, or its largest init
    container's where that is more (init containers run one at a time, before the rest)."""
    spec = pod.get("spec") or {}
    running = [_resources(c, gpu_resource) for c in spec.get("containers") or ()]
    if not running:
        raise Refused("the pod has no containers")
    gpus, cpu, memory = (sum(r[i] for r in running) for i in range(3))
    for init in spec.get("initContainers") or ():
        g, c, m = _resources(init, gpu_resource)
        gpus, cpu, memory = max(gpus, g), max(cpu, c), max(memory, m)
    milli = max(1, math.ceil(Decimal(cpu) * 1000))
    mib = max(1, math.ceil(Decimal(memory) / 2**20))
    return int(gpus), milli, mib


def _labels(obj: Obj) -> Mapping[str, str]:
    labels = at(obj, ("metadata", "labels"))
    return labels if isinstance(labels, dict) else {}


def group_of(pod: Obj) -> tuple[str, int] | None:
    """(group name, size) of a pod that belongs to a pod group; None for a single pod. A
    size that is not a whole number in 1..MAX_GROUP is Refused."""
    labels = _labels(pod)
    name = labels.get(LABEL_POD_GROUP)
    if not name:
        return None
    size = labels.get(LABEL_POD_GROUP_SIZE, "")
    if not size.isdigit() or not 1 <= int(size) <= MAX_GROUP:
        raise Refused(
            f"pod group {name!r}: label {LABEL_POD_GROUP_SIZE} must be a whole number of pods "
            f"from 1 to {MAX_GROUP}, got {size!r}"
        )
    return name, int(size)


def shape_pods(pods: Sequence[Obj], gpu_resource: str = "nvidia.com/gpu") -> Shaped:
    """The payload of a single pod, or of a whole pod group (every pod of it, any order)."""
    ordered = sorted(pods, key=lambda p: str(at(p, ("metadata", "name"))))
    if not ordered:
        raise Refused("no pods")
    first = ordered[0]
    group = group_of(first)
    if group is not None and len(ordered) != group[1]:
        raise Refused(f"pod group {group[0]!r} has {len(ordered)} of its {group[1]} pods")
    shapes = {pod_resources(p, gpu_resource) for p in ordered}
    if len(shapes) > 1:
        raise Refused(
            f"pod group {group[0] if group else ''!r}: its pods ask for different resources "
            "(a gang's replicas must be alike)"
        )
    gpus, cpu_milli, memory_mib = shapes.pop()
    labels = _labels(first)
    container = (at(first, ("spec", "containers")) or [{}])[0]
    command = [*(container.get("command") or ()), *(container.get("args") or ())]
    payload: dict[str, Any] = {
        "name": (group[0] if group else str(at(first, ("metadata", "name"))))[:63],
        "type": labels.get(LABEL_JOB_TYPE) or ("training" if len(ordered) > 1 else "batch"),
        "image": str(container.get("image") or ""),
        "command": [str(part) for part in command] or [ENTRYPOINT],
        "replicas": len(ordered),
        "resources": {"gpus": gpus, "cpu_milli": cpu_milli, "memory_mib": memory_mib},
        # Gantry cannot hold a started pod again (a gate cannot be added back): it is not
        # retried in a new attempt; the pod's own restartPolicy restarts its containers.
        "retry": {"limit": 0},
    }
    if labels.get(LABEL_PRIORITY):
        payload["priority_class"] = labels[LABEL_PRIORITY]
    if labels.get(LABEL_FLAVOR):
        payload["flavors"] = [labels[LABEL_FLAVOR]]
    deadline = at(first, ("spec", "activeDeadlineSeconds"))
    if isinstance(deadline, int) and deadline > 0:
        payload["max_runtime_s"] = deadline
    names = tuple(str(at(p, ("metadata", "name"))) for p in ordered)
    return Shaped(payload, names)
