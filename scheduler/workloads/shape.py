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
    name = group[0] if group else str(at(first, ("metadata", "name")))
    payload = _payload(name, _labels(first), first.get("spec") or {}, len(ordered), shapes.pop())
    names = tuple(str(at(p, ("metadata", "name"))) for p in ordered)
    return Shaped(payload, names)


def shape_job(job: Obj, gpu_resource: str = "nvidia.com/gpu") -> Shaped:
    """The payload of a batch/v1 Job: its `parallelism` pods (default 1) are the replicas of
    one gang, shaped by its pod template. Gantry runs all of a job's pods at once, so a Job
    that needs more completions than it runs at once (a work queue) is Refused."""
    spec = job.get("spec") or {}
    parallelism = spec.get("parallelism", 1)
    completions = spec.get("completions")
    if not isinstance(parallelism, int) or not 1 <= parallelism <= MAX_GROUP:
        raise Refused(f"spec.parallelism must be from 1 to {MAX_GROUP}, got {parallelism!r}")
    if completions is not None and completions != parallelism:
        raise Refused(
            f"it asks for {completions} completions {parallelism} at a time: Gantry runs a "
            "Job's pods all at once, so completions must equal parallelism"
        )
    template = spec.get("template") or {}
    pod = {"metadata": {"name": at(job, ("metadata", "name"))}, "spec": template.get("spec")}
    name = str(at(job, ("metadata", "name")))
    return Shaped(_payload(name, _labels(job), spec, parallelism, pod_resources(pod, gpu_resource)))


def _payload(
    name: str, labels: Mapping[str, str], spec: Obj, replicas: int, resources: tuple[int, int, int]
) -> dict[str, Any]:
    """The job spec of `replicas` pods alike, asking `resources` (GPUs, milli-CPU, MiB) each,
    from the labels the user set and the spec with `activeDeadlineSeconds` (a pod's, or a
    Job's; the pods' template is `spec["template"]["spec"]` for a Job, `spec` for a pod)."""
    pod_spec = (spec.get("template") or {}).get("spec") or spec
    container = (pod_spec.get("containers") or [{}])[0]
    command = [*(container.get("command") or ()), *(container.get("args") or ())]
    gpus, cpu_milli, memory_mib = resources
    payload: dict[str, Any] = {
        "name": name[:63],
        "type": labels.get(LABEL_JOB_TYPE) or ("training" if replicas > 1 else "batch"),
        "image": str(container.get("image") or ""),
        "command": [str(part) for part in command] or [ENTRYPOINT],
        "replicas": replicas,
        "resources": {"gpus": gpus, "cpu_milli": cpu_milli, "memory_mib": memory_mib},
        # Not retried by Gantry in a new attempt: a started pod cannot be held again (a gate
        # cannot be added back), and a Job that failed is suspended again, its own
        # backoffLimit aside (docs/kubernetes-native.md).
        "retry": {"limit": 0},
    }
    if labels.get(LABEL_PRIORITY):
        payload["priority_class"] = labels[LABEL_PRIORITY]
    if labels.get(LABEL_FLAVOR):
        payload["flavors"] = [labels[LABEL_FLAVOR]]
    deadline = spec.get("activeDeadlineSeconds")
    if isinstance(deadline, int) and deadline > 0:
        payload["max_runtime_s"] = deadline
    return payload
