"""The rules of the fake apiserver that are not HTTP: errors, selectors, patches, admission."""

from __future__ import annotations

import base64
import copy
import json
from datetime import UTC, datetime
from typing import Any

Obj = dict[str, Any]
CLUSTER_SCOPED = {"nodes", "namespaces"}
NAMESPACED = {"pods", "services", "events", "networkpolicies", "rolebindings", "jobs"}
# The custom kinds users create (issue 37), served as their CRDs serve them.
NAMESPACED |= {"jobsets", "leaderworkersets", "rayjobs", "trainjobs", "pytorchjobs"}
# The Trainer's runtimes a TrainJob names (read by the workload controller).
NAMESPACED |= {"trainingruntimes"}
CLUSTER_SCOPED |= {"clustertrainingruntimes"}
# The key a JSON patch's operations travel under, from the handler to `patch`.
JSON_PATCH = "$json-patch"


class ApiError(Exception):
    def __init__(self, code: int, reason: str, message: str) -> None:
        super().__init__(message)
        self.code, self.reason, self.message = code, reason, message


def status_body(code: int, reason: str, message: str) -> Obj:
    return {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Success" if code < 400 else "Failure",
        "message": message,
        "reason": reason,
        "code": code,
    }


# -- selectors, patches, pod security -------------------------------------------------------


def selected(obj: Obj, query: dict[str, str]) -> bool:
    labels = obj["metadata"].get("labels") or {}
    for term in filter(None, query.get("labelSelector", "").split(",")):
        if "!=" in term:
            key, value = term.split("!=", 1)
            if labels.get(key) == value:
                return False
        elif "=" in term:
            key, value = term.replace("==", "=").split("=", 1)
            if labels.get(key) != value:
                return False
        elif term not in labels:
            return False
    for term in filter(None, query.get("fieldSelector", "").split(",")):
        key, value = term.split("=", 1)
        if _field(obj, key) != value:
            return False
    return True


def _field(obj: Obj, path: str) -> str:
    value: Any = obj
    for part in path.split("."):
        value = value.get(part) if isinstance(value, dict) else None
    return "" if value is None else str(value)


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386 JSON merge patch (also used for strategic merge: enough for our bodies)."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    result = target if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge_patch(result.get(key), value)
    return result


def restricted_violations(pod: Obj) -> list[str]:
    """The restricted Pod Security Standard checks that matter for Gantry's pods, worded as the
    real admission plugin words them (for a pod of one container; it groups several)."""
    spec = pod.get("spec") or {}
    problems = []
    hosts = [f"{k}=true" for k in ("hostNetwork", "hostPID", "hostIPC") if spec.get(k)]
    if hosts:
        problems.append(f"host namespaces ({', '.join(hosts)})")
    paths = [f'"{v.get("name")}"' for v in spec.get("volumes") or () if "hostPath" in v]
    if paths:
        problems.append(f"hostPath volumes (volume {', '.join(paths)})")
    pod_sc = spec.get("securityContext") or {}
    for c in spec.get("containers") or ():
        sc = c.get("securityContext") or {}
        name = f'container "{c.get("name")}"'
        if sc.get("privileged"):
            problems.append(f"privileged ({name} must not set securityContext.privileged=true)")
        if sc.get("allowPrivilegeEscalation") is not False:
            problems.append(
                f"allowPrivilegeEscalation != false ({name} must set "
                "securityContext.allowPrivilegeEscalation=false)"
            )
        caps = sc.get("capabilities") or {}
        if "ALL" not in (caps.get("drop") or ()):
            problems.append(
                f"unrestricted capabilities ({name} must set "
                'securityContext.capabilities.drop=["ALL"])'
            )
        added = sorted(set(caps.get("add") or ()) - {"NET_BIND_SERVICE"})
        if added:
            listed = ", ".join(f'"{a}"' for a in added)
            problems.append(
                f"unrestricted capabilities ({name} must not include {listed} in "
                "securityContext.capabilities.add)"
            )
        if not (sc.get("runAsNonRoot") or pod_sc.get("runAsNonRoot")):
            problems.append(
                f"runAsNonRoot != true (pod or {name} must set securityContext.runAsNonRoot=true)"
            )
        if 0 in (sc.get("runAsUser"), pod_sc.get("runAsUser")):
            problems.append(f"runAsUser=0 (pod or {name} must not set runAsUser=0)")
        seccomp = (sc.get("seccompProfile") or pod_sc.get("seccompProfile") or {}).get("type")
        if seccomp not in ("RuntimeDefault", "Localhost"):
            problems.append(
                f"seccompProfile (pod or {name} must set securityContext.seccompProfile.type "
                'to "RuntimeDefault" or "Localhost")'
            )
    return problems


def now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def encode_continue(offset: int) -> str:
    return base64.urlsafe_b64encode(json.dumps({"offset": offset}).encode()).decode()


def decode_continue(token: str) -> int:
    return int(json.loads(base64.urlsafe_b64decode(token))["offset"]) if token else 0


def canonicalize_resources(pod: Obj) -> None:
    """Quantities as the apiserver stores them (the shortest exact form): 2000m -> 2,
    8192Mi -> 8Gi. A client comparing what it sent with what it reads must allow for this."""
    for container in (pod.get("spec") or {}).get("containers") or ():
        for section in (container.get("resources") or {}).values():
            for name, value in section.items():
                section[name] = _canonical(str(value))


def _canonical(value: str) -> str:
    if value.endswith("m") and value[:-1].isdigit() and int(value[:-1]) % 1000 == 0:
        return str(int(value[:-1]) // 1000)
    for small, big in (("Mi", "Gi"), ("Ki", "Mi")):
        if value.endswith(small) and value[:-2].isdigit() and int(value[:-2]) % 1024 == 0:
            return _canonical(f"{int(value[:-2]) // 1024}{big}")
    return value


# What the API server itself sets on a pod created with scheduling gates (issue 37).
SCHEDULING_GATED = {
    "type": "PodScheduled",
    "status": "False",
    "reason": "SchedulingGated",
    "message": "Scheduling is blocked due to non-empty scheduling gates",
}


def only_gates_removed(current: Obj, new: Obj) -> None:
    """A pod's scheduling gates may be removed after its creation, never added (422)."""
    had = {g.get("name") for g in current["spec"].get("schedulingGates") or ()}
    for index, gate in enumerate(new.get("spec", {}).get("schedulingGates") or ()):
        if gate.get("name") not in had:
            raise ApiError(
                422,
                "Invalid",
                f'Pod "{current["metadata"]["name"]}" is invalid: '
                f"spec.schedulingGates[{index}].name: Forbidden: only deletion is allowed, "
                f"but found new scheduling gate '{gate.get('name')}'",
            )


def job_template_kept(current: Obj, new: Obj) -> None:
    """A Job's pod template, as the real API server guards it (issue 37): its spec never
    changes; its labels and annotations only while the Job is suspended and has never run
    (the fake marks a Job that has run with `status.startTime` when it is unsuspended, as the
    job controller starts it). A refusal is a 422, as the real server's."""
    before = (current.get("spec") or {}).get("template") or {}
    after = (new.get("spec") or {}).get("template") or {}
    if before.get("spec") != after.get("spec"):
        raise ApiError(422, "Invalid", "spec.template.spec: field is immutable")
    ran = bool((current.get("status") or {}).get("startTime"))
    if before.get("metadata") != after.get("metadata") and (
        ran or not (current.get("spec") or {}).get("suspend")
    ):
        raise ApiError(422, "Invalid", "spec.template: Invalid value: field is immutable")
    if not (new.get("spec") or {}).get("suspend") and not ran:
        new.setdefault("status", {})["startTime"] = now()


def jobset_template_kept(current: Obj, new: Obj) -> None:
    """A JobSet's replicated jobs, as its release's validating webhook guards them (v0.11.1,
    `ValidateUpdate`): immutable, but for each pod template's labels and annotations (and
    scheduling fields) while the JobSet is suspended or being suspended. A refusal is a 422."""

    def munged(obj: Obj) -> list[Any]:
        jobs = copy.deepcopy((obj.get("spec") or {}).get("replicatedJobs") or [])
        for job in jobs:
            template = ((job.get("template") or {}).get("spec") or {}).get("template") or {}
            template.pop("metadata", None)
        return jobs

    suspended = (current.get("spec") or {}).get("suspend") or (new.get("spec") or {}).get("suspend")
    before = munged(current) if suspended else (current.get("spec") or {}).get("replicatedJobs")
    after = munged(new) if suspended else (new.get("spec") or {}).get("replicatedJobs")
    if before != after:
        raise ApiError(422, "Invalid", "spec.replicatedJobs: Invalid value: field is immutable")
