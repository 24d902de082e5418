"""An in-memory Kubernetes API server that the real `kubernetes` client talks to over HTTP.

It keeps the rules the backend depends on, and no more:
- resourceVersion: one counter for every write; a PUT or PATCH carrying a stale
  `metadata.resourceVersion` is 409 Conflict (optimistic concurrency).
- 409 AlreadyExists on creating an existing name; pods/binding answers 409 when the pod is
  already assigned to a node or being deleted, and 201 with a Status object (as the real one
  does: the client cannot deserialize it, see scheduler/backends/kubernetes/backend.py).
- Graceful deletion: a bound pod deleted with a grace period keeps existing, with a
  deletionTimestamp, until the test plays the kubelet (`finalize_pod`). Owned Services go with
  their owner pod (the garbage collector).
- Watches (`?watch=true`): chunked JSON lines from the requested resourceVersion; an ERROR event
  with code 410 when that version is older than the last `compact()`; `end_watches()` closes
  open streams silently.
- Faults on command (`inject`): the next N requests matching a method and path answer 429 with
  Retry-After, 500 or 503, hang past the client's timeout, or have their connection reset
  (a watch is reset after its first events), or do the write and lose the answer; a watch
  can "stall": its backlog sent, then nothing while it stays open.
- Pods that never start, as the kubelet and scheduler report them: `stay_pending` sets a
  container's waiting reason and message (ImagePullBackOff, CreateContainerConfigError) or
  a PodScheduled=False condition (Unschedulable). A pod never finalized stays Terminating.
- Pod logs (`pods/{name}/log`), as the kubelet serves them through the apiserver: 404 for a
  pod that is gone; 204 No Content for a pod not bound yet, followed or not (no kubelet to ask);
  400 `container "main" in pod "x" is waiting to start: ContainerCreating` while no container
  runs; `tailLines`, `sinceSeconds`, `limitBytes` and `timestamps` (RFC 3339 with nanoseconds,
  trailing zeros dropped, as Go prints them); `follow` streams until the pod ends or is gone
  (or, with a "reset" fault, is cut after the lines so far).
  Lines are written by the test playing the container (`write_log`).
- Restricted Pod Security: a namespace labelled `pod-security.kubernetes.io/enforce:
  restricted` rejects pods that are not (403), like the real admission plugin.
- Priority admission: a pod naming a PriorityClass that does not exist is 403; one that names
  an existing class gets its value and preemption policy (`add_priority_class`).
- A JobSet's replicated jobs change only in their pod templates' metadata, and only while the
  JobSet is suspended (its release's webhook); the custom kinds are served at their CRDs'
  versions (jobsets, leaderworkersets, rayjobs, trainjobs, pytorchjobs, issue 37).
- Gantry's mutating webhook (`webhook`, tests/k8s/fake_admission.py): creates in managed
  namespaces are held as the webhook answers; while it is down they are refused (500), as
  its `failurePolicy: Fail` makes the real API server refuse them.
- Scheduling gates (issue 37): a pod created with gates is PodScheduled=False, reason
  SchedulingGated; one with gates and a nodeName is 422; pods/binding of a gated pod is 409;
  an update may remove gates, never add one (422).
- Restarts (`restart`): open watches end, and the new server's watch cache holds nothing from
  before, so a watch from any earlier version is 410 Gone. `compact()` is harsher than a real
  compaction: a real API server keeps serving, from its watch cache, versions it still holds
  after etcd compacted them; the fake answers 410 at once (both are what a client must survive).
"""

from __future__ import annotations

import copy
import re
import threading
import uuid
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from http.server import ThreadingHTTPServer
from typing import Any

import jsonpatch
import jsonpointer

from tests.k8s.fake_admission import FakeWebhook
from tests.k8s.fake_http import Handler
from tests.k8s.fake_rules import (
    JSON_PATCH,
    SCHEDULING_GATED,
    ApiError,
    Obj,
    canonicalize_resources,
    decode_continue,
    encode_continue,
    job_template_kept,
    jobset_template_kept,
    merge_patch,
    now,
    only_gates_removed,
    restricted_violations,
    selected,
    status_body,
)

__all__ = ["ApiError", "FakeApiServer", "restricted_violations"]


@dataclass
class Fault:
    # "429" | "500" | "503" | "timeout" | "reset" | "lost" (done, answer lost) | "stall" (a
    # watch that sends nothing after its backlog)
    kind: str
    path: re.Pattern[str]
    method: str | None
    remaining: int
    retry_after: int = 1
    delay_s: float = 1.0
    watch: bool | None = None  # only watch requests (True), only others (False), any (None)


@dataclass
class _Event:
    rv: int
    resource: str
    type: str
    obj: Obj


@dataclass
class FakeState:
    objects: dict[tuple[str, str, str], Obj] = field(default_factory=dict)
    events: list[_Event] = field(default_factory=list)
    rv: int = 1
    compacted_rv: int = 0
    watch_generation: int = 0
    # (namespace, pod) -> (written at, line): what the container printed.
    logs: dict[tuple[str, str], list[tuple[datetime, str]]] = field(default_factory=dict)


class FakeApiServer:
    def __init__(self) -> None:
        self.state = FakeState()
        self.cond = threading.Condition()
        self.faults: list[Fault] = []
        self.requests: list[tuple[str, str]] = []  # (method, path) of every request
        self.watch_linger_s: float | None = None  # close an idle watch after this long
        # Streams past their backlog, waiting for changes (what `end_watches` ends); a test
        # that ends a watch waits for one first, or its end lands before the stream opens.
        self.streaming: dict[str, int] = {}
        # `account_lag`: a namespace created through the API has no `default` ServiceAccount
        # until the controller manager makes it, moments later: its first pod is refused
        # (403), as on a real server. Off by default: tests that make namespaces and pods
        # by hand would otherwise wait for it, as they must on a real server.
        self.account_lag = False
        self.accounts_pending: set[str] = set()
        # Gantry's mutating webhook, called for creates as the API server calls it, and down
        # on command (tests/k8s/fake_admission.py); none by default.
        self.webhook: FakeWebhook | None = None
        self._stopping = False
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self._server.fake = self  # type: ignore[attr-defined]
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True
        )

    # -- lifecycle ----------------------------------------------------------------------------

    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host!s}:{port}"

    def start(self) -> FakeApiServer:
        self._thread.start()
        return self

    def stop(self) -> None:
        with self.cond:
            self._stopping = True
            self.cond.notify_all()
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)

    # -- test controls ------------------------------------------------------------------------

    def inject(
        self,
        kind: str,
        path: str = ".*",
        *,
        count: int = 1,
        method: str | None = None,
        retry_after: int = 1,
        delay_s: float = 1.0,
        watch: bool | None = None,
    ) -> None:
        """The next `count` requests whose path matches `path` (a regex) fail as `kind`.

        A "reset" of a watch request sends the stream's first events, then resets; of a
        followed pod log, the lines so far, then resets (a stream cut mid-way).
        """
        fault = Fault(kind, re.compile(path), method, count, retry_after, delay_s, watch)
        with self.cond:
            self.faults.append(fault)

    def compact(self) -> None:
        """Forget history: a watch from any version before now answers 410 Gone."""
        with self.cond:
            self.state.compacted_rv = self.state.rv
            self.state.events.clear()

    def restart(self) -> None:
        """As a real API server restarting: every open watch ends, and a watch from any
        version before now is 410 Gone (the new watch cache starts after them)."""
        with self.cond:
            self.state.watch_generation += 1
            self.state.compacted_rv = self.state.rv + 1
            self.state.events.clear()
            self.cond.notify_all()

    def add_priority_class(
        self, name: str, value: int, preemption_policy: str = "PreemptLowerPriority"
    ) -> Obj:
        body = {"metadata": {"name": name}, "value": value, "preemptionPolicy": preemption_policy}
        return self.create("priorityclasses", "", body)

    def end_watches(self) -> None:
        """Close every open watch stream without an error event (a silent end)."""
        with self.cond:
            self.state.watch_generation += 1
            self.cond.notify_all()

    def add_namespace(self, name: str, labels: dict[str, str] | None = None) -> Obj:
        body = {"metadata": {"name": name, "labels": labels or {}}}
        made = self.create("namespaces", "", body)
        self.accounts_pending.discard(name)  # set up before the test: its account exists
        return made

    def add_node(
        self,
        name: str,
        *,
        gpus: int = 8,
        allocatable_gpus: int | None = None,
        product: str = "NVIDIA-H100-80GB-HBM3",
        gpu_memory_mib: int = 81920,
        cpu: str = "96",
        memory: str = "1024Gi",
        ready: bool = True,
        labels: dict[str, str] | None = None,
        taints: list[Obj] | None = None,
        extra: dict[str, str] | None = None,
    ) -> Obj:
        capacity = {"cpu": cpu, "memory": memory, "pods": "110", **(extra or {})}
        node_labels = {"kubernetes.io/hostname": name, **(labels or {})}
        if gpus:
            capacity["nvidia.com/gpu"] = str(gpus)
            node_labels |= {
                "nvidia.com/gpu.product": product,
                "nvidia.com/gpu.memory": str(gpu_memory_mib),
                "nvidia.com/gpu.count": str(gpus),
            }
        allocatable = dict(capacity)
        if gpus and allocatable_gpus is not None:
            allocatable["nvidia.com/gpu"] = str(allocatable_gpus)
        condition = {"type": "Ready", "status": "True" if ready else "Unknown"}
        body = {
            "metadata": {"name": name, "labels": node_labels},
            "spec": {"taints": taints or []},
            "status": {"capacity": capacity, "allocatable": allocatable, "conditions": [condition]},
        }
        return self.create("nodes", "", body)

    def get(self, resource: str, namespace: str, name: str) -> Obj | None:
        with self.cond:
            found = self.state.objects.get((resource, namespace, name))
            return copy.deepcopy(found) if found else None

    def mutate(self, resource: str, namespace: str, name: str, change: Any) -> Obj:
        """Apply `change(obj)` in place as one write (a kubelet or controller update)."""
        with self.cond:
            obj = self.state.objects[(resource, namespace, name)]
            change(obj)
            self._bump(resource, "MODIFIED", obj)
            return copy.deepcopy(obj)

    def set_pod_status(self, namespace: str, name: str, status: Obj) -> Obj:
        return self.mutate("pods", namespace, name, lambda pod: pod["status"].update(status))

    def stay_pending(
        self, namespace: str, name: str, reason: str, message: str, *, unschedulable: bool = False
    ) -> Obj:
        """The pod stays Pending for the reason given: a container waiting (the kubelet's
        ImagePullBackOff, ErrImagePull, CreateContainerConfigError), or with `unschedulable`
        a PodScheduled=False condition (the scheduler's Unschedulable)."""

        def pending(pod: Obj) -> None:
            status = pod["status"]
            status["phase"] = "Pending"
            if unschedulable:
                status["conditions"] = [
                    c for c in status.get("conditions", []) if c.get("type") != "PodScheduled"
                ] + [{"type": "PodScheduled", "status": "False", "reason": reason,
                      "message": message}]  # fmt: skip
                return
            waiting = {"waiting": {"reason": reason, "message": message}}
            status["containerStatuses"] = [
                {"name": c["name"], "ready": False, "restartCount": 0, "state": waiting}
                for c in pod["spec"].get("containers", [])
            ]

        return self.mutate("pods", namespace, name, pending)

    def run_container(self, namespace: str, name: str) -> Obj:
        """The kubelet started the pod's containers: Running, each container running."""
        running = {"running": {"startedAt": now()}}

        def start(pod: Obj) -> None:
            pod["status"]["phase"] = "Running"
            pod["status"]["containerStatuses"] = [
                {"name": c["name"], "ready": True, "restartCount": 0, "state": running}
                for c in pod["spec"].get("containers", [])
            ]

        return self.mutate("pods", namespace, name, start)

    def write_log(self, namespace: str, name: str, *lines: str, at: datetime | None = None) -> None:
        """The container prints `lines` (at `at`, else now)."""
        with self.cond:
            stamp = at or datetime.now(UTC)
            self.state.logs.setdefault((namespace, name), []).extend((stamp, t) for t in lines)
            self.cond.notify_all()

    def pod_log(
        self, namespace: str, name: str, query: dict[str, str], start: int = 0
    ) -> list[str]:
        """The log lines from the `start`-th on, as `pods/log` with `query` answers them (call
        with `cond` held). Raises ApiError as the apiserver answers."""
        pod = self._existing("pods", namespace, name)
        names = [c["name"] for c in pod["spec"].get("containers", [])]
        container = query.get("container") or (names[0] if names else "")
        if container not in names:
            raise ApiError(400, "BadRequest", f"container {container} is not valid for pod {name}")
        if not pod["spec"].get("nodeName"):
            return []  # no node, no kubelet: the apiserver answers an empty log
        statuses = pod.get("status", {}).get("containerStatuses") or []
        state = next((s.get("state") or {} for s in statuses if s.get("name") == container), {})
        if not state or "waiting" in state:
            reason = (state.get("waiting") or {}).get("reason") or "ContainerCreating"
            if reason in {"ImagePullBackOff", "ErrImagePull"}:
                reason = "trying and failing to pull image"
            raise ApiError(
                400,
                "BadRequest",
                f'container "{container}" in pod "{name}" is waiting to start: {reason}',
            )
        entries = self.state.logs.get((namespace, name), [])[start:]
        if query.get("sinceSeconds"):
            since = datetime.now(UTC) - timedelta(seconds=int(query["sinceSeconds"]))
            entries = [e for e in entries if e[0] >= since]
        if query.get("tailLines") and not start:
            entries = entries[-int(query["tailLines"]) :] if int(query["tailLines"]) else []
        stamps = query.get("timestamps") in ("true", "1")
        return [f"{_rfc3339_nano(at)} {text}" if stamps else text for at, text in entries]

    def pod_ended(self, namespace: str, name: str) -> bool:
        pod = self.state.objects.get(("pods", namespace, name))
        return pod is None or pod["status"].get("phase") in {"Succeeded", "Failed"}

    def finalize_pod(self, namespace: str, name: str) -> None:
        """The kubelet confirms the containers are gone: the pod object disappears."""
        with self.cond:
            self._remove("pods", namespace, name)

    def delete_node(self, name: str) -> None:
        with self.cond:
            self._remove("nodes", "", name)

    # -- store --------------------------------------------------------------------------------

    def _bump(self, resource: str, kind: str, obj: Obj) -> None:
        self.state.rv += 1
        obj["metadata"]["resourceVersion"] = str(self.state.rv)
        self.state.events.append(_Event(self.state.rv, resource, kind, copy.deepcopy(obj)))
        self.cond.notify_all()

    def create(self, resource: str, namespace: str, body: Obj) -> Obj:
        with self.cond:
            meta = body.setdefault("metadata", {})
            name = meta.get("name") or ""
            if not name:
                raise ApiError(422, "Invalid", "metadata.name: Required value")
            if namespace and ("namespaces", "", namespace) not in self.state.objects:
                raise ApiError(404, "NotFound", f'namespaces "{namespace}" not found')
            if self.webhook is not None:  # mutating admission comes before storage
                ns = self.state.objects.get(("namespaces", "", namespace))
                self.webhook.admit(resource, ns, body)
            key = (resource, namespace, name)
            if key in self.state.objects:
                raise ApiError(409, "AlreadyExists", f'{resource} "{name}" already exists')
            if resource == "namespaces" and self.account_lag:
                self.accounts_pending.add(name)
            if resource == "pods":
                self._admit_pod(namespace, body)
                canonicalize_resources(body)
                body.setdefault("status", {"phase": "Pending"})
            meta |= {"uid": str(uuid.uuid4()), "creationTimestamp": now()}
            if namespace:
                meta["namespace"] = namespace
            self.state.objects[key] = body
            self._bump(resource, "ADDED", body)
            return copy.deepcopy(body)

    def _admit_pod(self, namespace: str, pod: Obj) -> None:
        if namespace in self.accounts_pending:
            # The ServiceAccount admission plugin; the controller catches up meanwhile.
            self.accounts_pending.discard(namespace)
            raise ApiError(
                403,
                "Forbidden",
                f'pods "{pod["metadata"]["name"]}" is forbidden: error looking up service '
                f'account {namespace}/default: serviceaccount "default" not found',
            )
        self._admit_priority(pod)
        gates = pod["spec"].get("schedulingGates") or []
        if gates and pod["spec"].get("nodeName"):
            raise ApiError(
                422,
                "Invalid",
                f'Pod "{pod["metadata"]["name"]}" is invalid: spec.nodeName: Forbidden: cannot '
                "be set until all schedulingGates have been cleared",
            )
        if gates:
            pod["status"] = {"phase": "Pending", "conditions": [dict(SCHEDULING_GATED)]}
        ns = self.state.objects[("namespaces", "", namespace)]
        if (
            ns["metadata"].get("labels", {}).get("pod-security.kubernetes.io/enforce")
            != "restricted"
        ):
            return
        problems = restricted_violations(pod)
        if problems:
            raise ApiError(
                403,
                "Forbidden",
                f'pods "{pod["metadata"]["name"]}" is forbidden: violates PodSecurity '
                f'"restricted:latest": {", ".join(problems)}',
            )

    def _admit_priority(self, pod: Obj) -> None:
        """The Priority admission plugin (mutating, so before PodSecurity's validation)."""
        spec = pod.setdefault("spec", {})
        wanted = spec.get("priorityClassName")
        if not wanted:
            return
        found = self.state.objects.get(("priorityclasses", "", wanted))
        if found is None:
            raise ApiError(
                403,
                "Forbidden",
                f'pods "{pod["metadata"]["name"]}" is forbidden: no PriorityClass with name '
                f"{wanted} was found",
            )
        spec["priority"] = found["value"]
        spec["preemptionPolicy"] = found.get("preemptionPolicy", "PreemptLowerPriority")

    def _remove(self, resource: str, namespace: str, name: str) -> Obj:
        obj = self.state.objects.pop((resource, namespace, name), None)
        if obj is None:
            raise ApiError(404, "NotFound", f'{resource} "{name}" not found')
        self._bump(resource, "DELETED", obj)
        uid = obj["metadata"].get("uid")
        owned = [
            key
            for key, other in self.state.objects.items()
            if any(ref.get("uid") == uid for ref in other["metadata"].get("ownerReferences", ()))
        ]
        for key in owned:
            self._remove(*key)
        return obj

    def _existing(self, resource: str, namespace: str, name: str) -> Obj:
        obj = self.state.objects.get((resource, namespace, name))
        if obj is None:
            raise ApiError(404, "NotFound", f'{resource} "{name}" not found')
        return obj

    def _check_version(self, current: Obj, body: Obj, name: str) -> None:
        wanted = (body.get("metadata") or {}).get("resourceVersion")
        if wanted and wanted != current["metadata"]["resourceVersion"]:
            raise ApiError(
                409,
                "Conflict",
                f'Operation cannot be fulfilled on "{name}": the object has been modified; '
                "please apply your changes to the latest version and try again",
            )

    def replace(self, resource: str, namespace: str, name: str, body: Obj) -> Obj:
        with self.cond:
            current = self._existing(resource, namespace, name)
            if not (body.get("metadata") or {}).get("resourceVersion"):
                raise ApiError(422, "Invalid", "metadata.resourceVersion: must be specified")
            self._check_version(current, body, name)
            return self._write(resource, current, body)

    def patch(self, resource: str, namespace: str, name: str, body: Obj) -> Obj:
        with self.cond:
            current = self._existing(resource, namespace, name)
            if JSON_PATCH in body:  # RFC 6902, as `kubectl patch --type=json` sends it
                try:
                    patched = jsonpatch.apply_patch(copy.deepcopy(current), body[JSON_PATCH])
                except jsonpatch.JsonPatchTestFailed as exc:
                    raise ApiError(422, "Invalid", f"the test operation failed: {exc}") from exc
                except (jsonpatch.JsonPatchException, jsonpointer.JsonPointerException) as exc:
                    raise ApiError(422, "Invalid", f"the patch cannot be applied: {exc}") from exc
                return self._write(resource, current, patched)
            if not isinstance(body, dict):  # a JSON patch sent as a merge patch
                raise ApiError(
                    400,
                    "BadRequest",
                    "json: cannot unmarshal array into Go value of type map[string]interface {}",
                )
            self._check_version(current, body, name)
            return self._write(resource, current, merge_patch(copy.deepcopy(current), body))

    def _write(self, resource: str, current: Obj, new: Obj) -> Obj:
        if resource == "pods":
            frozen = ("containers", "nodeName", "schedulerName", "securityContext", "volumes")
            if any(current["spec"].get(k) != new.get("spec", {}).get(k) for k in frozen):
                raise ApiError(422, "Invalid", "spec: Forbidden: pod updates may not change fields")
            only_gates_removed(current, new)
        if resource == "jobs":
            job_template_kept(current, new)
        if resource == "jobsets":
            jobset_template_kept(current, new)
        for key in ("uid", "creationTimestamp", "namespace", "name"):
            if key in current["metadata"]:
                new["metadata"][key] = current["metadata"][key]
        current.clear()
        current.update(new)
        self._bump(resource, "MODIFIED", current)
        return copy.deepcopy(current)

    def delete(self, resource: str, namespace: str, name: str, grace: int | None) -> Obj:
        with self.cond:
            obj = self._existing(resource, namespace, name)
            if resource != "pods":
                return copy.deepcopy(self._remove(resource, namespace, name))
            grace = obj["spec"].get("terminationGracePeriodSeconds", 30) if grace is None else grace
            finished = (obj.get("status") or {}).get("phase") in ("Succeeded", "Failed")
            if obj["spec"].get("nodeName") and grace > 0 and not finished:
                meta = obj["metadata"]
                if not meta.get("deletionTimestamp"):
                    meta |= {"deletionTimestamp": now(), "deletionGracePeriodSeconds": grace}
                    self._bump(resource, "MODIFIED", obj)
                return copy.deepcopy(obj)
            return copy.deepcopy(self._remove(resource, namespace, name))

    def bind(self, namespace: str, name: str, body: Obj) -> Obj:
        with self.cond:
            pod = self._existing("pods", namespace, name)
            target = (body.get("target") or {}).get("name")
            if not target:
                raise ApiError(422, "Invalid", "target.name: Required value")
            if pod["metadata"].get("deletionTimestamp"):
                raise ApiError(
                    409, "Conflict", f"pod {name} is being deleted, cannot be assigned to a host"
                )
            if pod["spec"].get("nodeName"):
                raise ApiError(
                    409,
                    "Conflict",
                    f'Operation cannot be fulfilled on pods/binding "{name}": pod {name} is '
                    f'already assigned to node "{pod["spec"]["nodeName"]}"',
                )
            if pod["spec"].get("schedulingGates"):
                raise ApiError(
                    409,
                    "Conflict",
                    f'Operation cannot be fulfilled on pods/binding "{name}": pod {name} has '
                    "non-empty .spec.schedulingGates",
                )
            pod["spec"]["nodeName"] = target
            pod["status"].setdefault("conditions", []).append(
                {"type": "PodScheduled", "status": "True"}
            )
            self._bump("pods", "MODIFIED", pod)
            return status_body(201, "", "")

    def list_objects(self, resource: str, namespace: str, query: dict[str, str]) -> Obj:
        with self.cond:
            items = self._matching(resource, namespace, query)
            offset = decode_continue(query.get("continue", ""))
            limit = int(query.get("limit") or 0) or len(items) or 1
            page = items[offset : offset + limit]
            meta: Obj = {"resourceVersion": str(self.state.rv)}
            if offset + limit < len(items):
                meta["continue"] = encode_continue(offset + limit)
            kind = resource[:-1].capitalize() + "List"
            return {"kind": kind, "apiVersion": "v1", "metadata": meta, "items": page}

    def _matching(self, resource: str, namespace: str, query: dict[str, str]) -> list[Obj]:
        keys = sorted(k for k in self.state.objects if k[0] == resource)
        return [
            copy.deepcopy(self.state.objects[k])
            for k in keys
            if (not namespace or k[1] == namespace) and selected(self.state.objects[k], query)
        ]


def _rfc3339_nano(at: datetime) -> str:
    """Go's RFC3339Nano: nanoseconds with trailing zeros dropped (no fraction when zero)."""
    fraction = f"{at.microsecond:06d}000".rstrip("0")
    return at.strftime("%Y-%m-%dT%H:%M:%S") + (f".{fraction}" if fraction else "") + "Z"
