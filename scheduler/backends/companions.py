"""Which pod templates of an object a user created make companions of its replica 0 (issue
37): the one rule that both the workload controller, shaping the object into a Gantry job
(`scheduler.workloads.shape_kinds`), and the daemon, labelling its templates as it admits it
(`scheduler.backends.kubernetes.resume`), apply, so that the pods counted beside replica 0
are the pods labelled `gantry.io/companion`, and the replicas the pods adopted.

A Gantry job's replicas are alike in GPUs. An object whose templates ask for GPUs in some
parts and none in others (a RayJob's CPU head beside GPU worker groups, nearly every
RayJob; a PyTorchJob's CPU Master; a JobSet's driver) would otherwise be refused. Its parts
without GPUs are companions: counted in CPU and memory with replica 0 (the first pod that
asks for GPUs), bound to its node, never adopted as replicas. Where no template asks for
GPUs, none is a companion (a CPU job of alike replicas), and parts that ask for different
non-zero GPUs are not alike: refused when shaped.

The rule reads the templates only, not how many pods each makes, so that the two sides
cannot differ on a count (a worker group scaled to 0 still makes its head a companion; the
shape then has no replica and is refused).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from decimal import InvalidOperation
from typing import Any

from kubernetes.utils.quantity import parse_quantity

# The most pods a job may run beside its replica 0 (its parts without GPUs, a RayJob's
# submitter, a TrainJob's initializers): their CPU and memory are added to replica 0's, and,
# the replicas being alike, every replica reserves that much.
MAX_COMPANIONS = 8


def asks_gpus(pod_spec: Mapping[str, Any] | None, gpu_resource: str) -> bool:
    """Whether a pod of `pod_spec` asks for `gpu_resource`: any container's or init
    container's limit (else request) of it not zero. A value that is not a quantity counts
    as asking (the shape refuses it, saying so)."""
    spec = pod_spec if isinstance(pod_spec, Mapping) else {}
    for container in [*(spec.get("containers") or ()), *(spec.get("initContainers") or ())]:
        resources = container.get("resources") if isinstance(container, Mapping) else None
        resources = resources if isinstance(resources, Mapping) else {}
        limits, requests = resources.get("limits") or {}, resources.get("requests") or {}
        value = limits.get(gpu_resource, requests.get(gpu_resource))
        if value is None:
            continue
        try:
            if parse_quantity(value) != 0:  # type: ignore[no-untyped-call]
                return True
        except (ValueError, InvalidOperation, TypeError):
            return True
    return False


def companion_templates(
    pod_specs: Sequence[Mapping[str, Any] | None], gpu_resource: str
) -> list[bool]:
    """For each of an object's pod templates (their pod specs, in the object's order): whether
    its pods are companions of replica 0, asking for no GPUs where another template does."""
    asks = [asks_gpus(spec, gpu_resource) for spec in pod_specs]
    return [not own and any(asks) for own in asks]
