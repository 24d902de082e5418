"""PodRequest -> Pod and headless Service manifests (plain dicts), from an allow-list.

docs/faults.md 23: nothing of a user's pod spec reaches Kubernetes. Every field below is written
here from typed PodRequest values; user strings (image, command, env) are checked and only ever land
in the container's image, command and env. The pod is restricted-PSS compliant (non-root,
no privilege escalation, all capabilities dropped, RuntimeDefault seccomp), has no service
account token, no host namespaces, no volumes, Gantry's own schedulerName, and the node Gantry
chose (`nodeName`, or none when the Binding API places it).
"""

from __future__ import annotations

import re
import socket
import uuid
from collections.abc import Mapping
from typing import Any

from kubernetes.utils.quantity import parse_quantity

from common.text import is_system_namespace
from scheduler.backends.base import RESERVED_ENV, BackendError, PodRequest, pod_name
from scheduler.backends.kubernetes.config import KubernetesConfig

LABEL_JOB = "gantry.io/job-id"
LABEL_ATTEMPT = "gantry.io/attempt"
LABEL_REPLICA = "gantry.io/replica"
LABEL_JOB_TYPE = "gantry.io/job-type"
LABEL_PRIORITY = "gantry.io/priority-class"
LABEL_MANAGED = "app.kubernetes.io/managed-by"
LABEL_COMPLETION_INDEX = "batch.kubernetes.io/job-completion-index"  # an Indexed Job's pods
ANNOTATION_GPUS = "gantry.io/gpu-indices"
CONTAINER = "main"

_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?\Z")
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,127}\Z")
_LABEL_VALUE_BAD = re.compile(r"[^A-Za-z0-9_.-]")
_MIG_PROFILE = re.compile(r"^\d+g\.\d+gb\Z")
DIST_ENV = ("WORLD_SIZE", "RANK", "MASTER_ADDR", "MASTER_PORT")


class UnsafePodSpec(BackendError, ValueError):
    """The request cannot be rendered safely (a reserved env name, a bad image or name).

    Permanent (a ValueError: retrying changes nothing), and a BackendError so that a daemon
    that only knows the Protocol's exceptions requeues the job instead of stopping.
    """


def service_name(job_id: int, attempt: int) -> str:
    """The headless Service of a distributed job attempt (a DNS-1035 label)."""
    return f"gantry-{job_id}-a{attempt}"


def label_value(text: str) -> str:
    """A label-safe rendering of `text`: allowed characters only, 63 at most, alnum ends."""
    return _LABEL_VALUE_BAD.sub("-", text)[:63].strip("-_.")


def _check(pod: PodRequest) -> None:
    if pod.name != pod_name(pod.job_id, pod.attempt, pod.replica):
        raise UnsafePodSpec(f"pod name {pod.name!r} is not the deterministic name")
    if not _DNS_LABEL.match(pod.namespace):
        raise UnsafePodSpec(f"namespace {pod.namespace!r} is not a DNS label")
    if is_system_namespace(pod.namespace):
        raise UnsafePodSpec(f"namespace {pod.namespace!r} is not a project namespace")
    if not pod.image or len(pod.image) > 512 or re.search(r"[\s\x00-\x1f\x7f]", pod.image):
        raise UnsafePodSpec("image must be a non-empty reference without spaces")
    if any("\x00" in arg for arg in pod.command):
        raise UnsafePodSpec("command arguments may not contain NUL bytes")
    for name, value in pod.env.items():
        if not _ENV_NAME.match(name) or RESERVED_ENV.match(name):
            raise UnsafePodSpec(f"environment variable {name!r} is not allowed")
        if "\x00" in value:
            raise UnsafePodSpec(f"environment variable {name!r} holds a NUL byte")
    if not re.match(r"^[a-z0-9-]{1,40}\Z", pod.priority_class):
        raise UnsafePodSpec(f"priority class {pod.priority_class!r} is not a class name")
    if not 0 <= pod.replica < pod.replicas:
        raise UnsafePodSpec("replica out of range")


def device_resources(pod: PodRequest, config: KubernetesConfig, device: str) -> dict[str, str]:
    """Extended resources of one replica. `device` is the node's device resource name."""
    if pod.mig_profile:
        if not _MIG_PROFILE.match(pod.mig_profile):
            raise UnsafePodSpec(f"unknown MIG profile {pod.mig_profile!r}")
        return {config.mig_resource_prefix + pod.mig_profile: "1"}
    if pod.gpu_milli <= 0:
        return {}
    if pod.gpu_milli % 1000 == 0:
        return {device: str(pod.gpu_milli // 1000)}
    if pod.gpu_milli > 1000 or device != config.gpu_resource:
        raise UnsafePodSpec("a GPU share must be less than one whole NVIDIA GPU")
    # HAMi's contract: one device, a memory cap in MiB and a percentage of its cores.
    share = {device: "1", config.share_cores_resource: str(max(pod.gpu_milli // 10, 1))}
    if pod.gpu_memory_mib:
        share[config.share_memory_resource] = str(pod.gpu_memory_mib)
    return share


def _labels(pod: PodRequest) -> dict[str, str]:
    return {
        LABEL_MANAGED: "gantry",
        LABEL_JOB: str(pod.job_id),
        LABEL_ATTEMPT: str(pod.attempt),
        LABEL_REPLICA: str(pod.replica),
        LABEL_JOB_TYPE: label_value(pod.job_type) or "unknown",
        LABEL_PRIORITY: pod.priority_class,
    }


def _env(pod: PodRequest, config: KubernetesConfig) -> list[dict[str, str]]:
    env = [{"name": k, "value": v} for k, v in sorted(pod.env.items())]
    if pod.replicas > 1:
        master = pod_name(pod.job_id, pod.attempt, 0)
        svc = service_name(pod.job_id, pod.attempt)
        env += [
            {"name": "WORLD_SIZE", "value": str(pod.replicas)},
            {"name": "RANK", "value": str(pod.replica)},
            {"name": "MASTER_ADDR", "value": f"{master}.{svc}.{pod.namespace}.svc"},
            {"name": "MASTER_PORT", "value": str(config.master_port)},
        ]
    return env


def _container(pod: PodRequest, config: KubernetesConfig, device: str) -> dict[str, Any]:
    amounts = {"cpu": f"{pod.cpu_milli}m", "memory": f"{pod.memory_mib}Mi"}
    amounts |= device_resources(pod, config, device)
    container: dict[str, Any] = {
        "name": CONTAINER,
        "image": pod.image,
        "env": _env(pod, config),
        # Equal requests and limits: Guaranteed QoS, last to be evicted under node pressure.
        "resources": {"requests": dict(amounts), "limits": dict(amounts)},
        "securityContext": {
            "allowPrivilegeEscalation": False,
            "privileged": False,
            "runAsNonRoot": True,
            "capabilities": {"drop": ["ALL"]},
            "seccompProfile": {"type": "RuntimeDefault"},
        },
    }
    if pod.command:
        container["command"] = list(pod.command)
    if pod.replicas > 1:
        container["ports"] = [{"name": "dist", "containerPort": config.master_port}]
    return container


def render_pod(
    pod: PodRequest, config: KubernetesConfig, device: str | None = None, *, bound: bool = False
) -> dict[str, Any]:
    """The Pod manifest of one replica: on `pod.node` when `bound`, else unbound (the
    Binding API assigns the node)."""
    _check(pod)
    device = device or config.gpu_resource
    spec: dict[str, Any] = {
        **({"nodeName": pod.node} if bound else {}),
        "schedulerName": config.scheduler_name,
        "priorityClassName": f"{config.priority_class_prefix}{pod.priority_class}",
        "restartPolicy": "Never",  # retries are the daemon's, with a new attempt and name
        "automountServiceAccountToken": False,
        "enableServiceLinks": False,
        "terminationGracePeriodSeconds": pod.grace_period_s,
        "securityContext": {
            "runAsNonRoot": True,
            "runAsUser": config.run_as_user,
            "runAsGroup": config.run_as_group,
            "seccompProfile": {"type": "RuntimeDefault"},
        },
        "containers": [_container(pod, config, device)],
    }
    if pod.gpu_milli > 0 or pod.mig_profile:
        spec["tolerations"] = [
            {"key": config.gpu_taint_key, "operator": "Exists", "effect": "NoSchedule"}
        ]
    if pod.max_runtime_s:
        spec["activeDeadlineSeconds"] = int(pod.max_runtime_s)
    if pod.replicas > 1:
        spec["hostname"] = pod.name
        spec["subdomain"] = service_name(pod.job_id, pod.attempt)
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": pod.name,
            "namespace": pod.namespace,
            "labels": _labels(pod),
            "annotations": {ANNOTATION_GPUS: ",".join(map(str, pod.gpu_indices))},
        },
        "spec": spec,
    }


def render_service(pod: PodRequest, config: KubernetesConfig) -> dict[str, Any]:
    """The headless Service that gives replicas stable DNS names (MASTER_ADDR)."""
    selector = {LABEL_JOB: str(pod.job_id), LABEL_ATTEMPT: str(pod.attempt)}
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {
            "name": service_name(pod.job_id, pod.attempt),
            "namespace": pod.namespace,
            "labels": {LABEL_MANAGED: "gantry", **selector},
        },
        "spec": {
            "clusterIP": "None",
            "selector": selector,
            # Rank 0 must resolve before every replica is Ready, or the rendezvous deadlocks.
            "publishNotReadyAddresses": True,
            "ports": [{"name": "dist", "port": config.master_port, "targetPort": "dist"}],
        },
    }


def is_adoptable(existing: Mapping[str, Any], rendered: Mapping[str, Any]) -> bool:
    """Whether a pod found under our deterministic name is the one we would have created.

    Adopting a look-alike would let whoever created it run a pod of their choosing on a GPU
    node, so every field we render must be present with our value (the apiserver may add
    defaults, never change ours), and nothing that widens access may have been added.
    """
    spec = existing.get("spec") or {}
    widened = (
        spec.get("hostNetwork")
        or spec.get("hostPID")
        or spec.get("hostIPC")
        or spec.get("volumes")
        or spec.get("initContainers")
        or spec.get("ephemeralContainers")
        or spec.get("serviceAccountName") not in (None, "", "default")
        or len(spec.get("containers") or ()) != 1
    )
    return not widened and _subset(rendered, existing, key="")


def _subset(want: Any, have: Any, key: str, parent: str = "") -> bool:
    if isinstance(want, Mapping):
        return isinstance(have, Mapping) and all(
            _subset(v, have.get(k), k, key) for k, v in want.items()
        )
    if isinstance(want, list):
        if not isinstance(have, list):
            return False
        if key == "tolerations":  # admission adds not-ready/unreachable tolerations
            return all(any(_subset(w, h, "") for h in have) for w in want)
        return len(want) == len(have) and all(
            _subset(w, h, "") for w, h in zip(want, have, strict=True)
        )
    if parent in ("requests", "limits"):  # the apiserver canonicalizes: 2000m -> 2, 8192Mi -> 8Gi
        return _same_quantity(want, have)
    return bool(want == have)


def _same_quantity(want: Any, have: Any) -> bool:
    try:
        return bool(parse_quantity(want) == parse_quantity(have))
    except (ValueError, ArithmeticError, TypeError):
        return False


def render_event(
    namespace: str,
    pod: str,
    reason: str,
    message: str,
    warning: bool,
    now: str,
    about: tuple[str, str, str] = ("v1", "Pod", ""),
) -> dict[str, Any]:
    """A core/v1 Event about one of our pods, or (`about`: apiVersion, kind, uid) another
    object (a user's Job). `kubectl describe` finds an object's events by its uid too."""
    api_version, kind, uid = about
    involved = {"apiVersion": api_version, "kind": kind, "name": pod, "namespace": namespace}
    if uid:
        involved["uid"] = uid
    return {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"name": f"{pod}.{uuid.uuid4().hex[:16]}", "namespace": namespace},
        "involvedObject": involved,
        "reason": reason,
        "message": message,
        "type": "Warning" if warning else "Normal",
        "source": {"component": "gantry-scheduler"},
        "reportingComponent": "gantry.io/scheduler",
        "reportingInstance": socket.gethostname()[:128],
        "firstTimestamp": now,
        "lastTimestamp": now,
        "count": 1,
    }


# What the admission webhook gives a held pod (scheduler/workloads/mutate.py says the same).
ADMISSION_GATE = "gantry.io/admission"
LABEL_HELD = "gantry.io/managed"


def held_pod_admission(existing: dict[str, Any], pod: PodRequest) -> list[dict[str, Any]]:
    """The JSON patch that admits a pod its user created and Gantry's webhook gated (issue
    37): Gantry's labels (so the daemon lists and reconciles it like its own), the devices
    it was given, and the gate removed (`test` first: the index is the one read). Nothing
    when all of that is already so (admitted before, by a daemon that then stopped)."""
    meta = existing.get("metadata") or {}
    ops: list[dict[str, Any]] = []
    if not isinstance(meta.get("labels"), dict):
        ops.append({"op": "add", "path": "/metadata/labels", "value": {}})
    labels = meta.get("labels") or {}
    for key, value in _labels(pod).items():
        if labels.get(key) != value:
            ops.append({"op": "add", "path": f"/metadata/labels/{_escape(key)}", "value": value})
    devices = ",".join(map(str, pod.gpu_indices))
    annotations = meta.get("annotations")
    if not isinstance(annotations, dict):
        ops.append({"op": "add", "path": "/metadata/annotations", "value": {}})
        annotations = {}
    if annotations.get(ANNOTATION_GPUS) != devices:
        path = f"/metadata/annotations/{_escape(ANNOTATION_GPUS)}"
        ops.append({"op": "add", "path": path, "value": devices})
    gates = (existing.get("spec") or {}).get("schedulingGates") or []
    for index, gate in enumerate(gates):
        if isinstance(gate, dict) and gate.get("name") == ADMISSION_GATE:
            path = f"/spec/schedulingGates/{index}"
            ops.append({"op": "test", "path": f"{path}/name", "value": ADMISSION_GATE})
            ops.append({"op": "remove", "path": path})
            break
    return ops


def _escape(key: str) -> str:
    """A JSON pointer step (RFC 6901)."""
    return key.replace("~", "~0").replace("/", "~1")


def workload_admission(job: dict[str, Any], pod: PodRequest) -> list[dict[str, Any]]:
    """The JSON patch that admits a Job a user created (issue 37): Gantry's job label on its
    pod template, then `spec.suspend` false. The Job's controller then makes its pods with
    that label and Gantry's schedulerName, for the daemon to bind. The labels go on at the
    first admission only (a Job's template may change while it has never run, not after:
    the real API server refuses it), so they name no attempt: a Job admitted again after a
    preemption is only unsuspended, and its new pods are adopted by the current attempt."""
    template = (job.get("spec") or {}).get("template") or {}
    ops: list[dict[str, Any]] = []
    if not isinstance((template.get("metadata") or {}).get("labels"), dict):
        if not isinstance(template.get("metadata"), dict):
            ops.append({"op": "add", "path": "/spec/template/metadata", "value": {}})
        ops.append({"op": "add", "path": "/spec/template/metadata/labels", "value": {}})
    labels = {
        LABEL_MANAGED: "gantry",
        LABEL_JOB: str(pod.job_id),
        LABEL_JOB_TYPE: label_value(pod.job_type) or "unknown",
    }
    have = (template.get("metadata") or {}).get("labels") or {}
    for key, value in labels.items():
        if have.get(key) != value:
            path = f"/spec/template/metadata/labels/{_escape(key)}"
            ops.append({"op": "add", "path": path, "value": value})
    ops.append({"op": "replace", "path": "/spec/suspend", "value": False})
    return ops
