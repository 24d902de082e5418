"""An in-memory Kubernetes API server that the real `kubernetes` client talks to over HTTP.

It keeps the rules the backend depends on, and no more:
- resourceVersion: one counter for every write; a PUT or PATCH carrying a stale
  `metadata.resourceVersion` is 409 Conflict (optimistic concurrency).
- 409 AlreadyExists on creating an existing name; pods/binding answers 409 when the pod is
  already assigned to a node or being deleted, and 201 with a Status object (as the real one
  does: the client cannot deserialize it, see scheduler/backends/kubernetes.py).
- Graceful deletion: a bound pod deleted with a grace period keeps existing, with a
  deletionTimestamp, until the test plays the kubelet (`finalize_pod`). Owned Services go with
  their owner pod (the garbage collector).
- Watches (`?watch=true`): chunked JSON lines from the requested resourceVersion; an ERROR event
  with code 410 when that version is older than the last `compact()`; `end_watches()` closes
  open streams silently.
- Faults on command (`inject`): the next N requests matching a method and path answer 429 with
  Retry-After, 500 or 503, hang past the client's timeout, or have their connection reset
  (a watch is reset after its first events), or do the write and lose the answer.
- Restricted Pod Security: a namespace labelled `pod-security.kubernetes.io/enforce:
  restricted` rejects pods that are not (403), like the real admission plugin.
"""

from __future__ import annotations

import base64
import contextlib
import copy
import json
import re
import socket
import struct
import threading
import time
import uuid
from dataclasses import dataclass, field
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

Obj = dict[str, Any]
CLUSTER_SCOPED = {"nodes", "namespaces"}
NAMESPACED = {"pods", "services", "events"}


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


@dataclass
class Fault:
    kind: str  # "429" | "500" | "503" | "timeout" | "reset" | "lost" (done, answer lost)
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


class FakeApiServer:
    def __init__(self) -> None:
        self.state = FakeState()
        self.cond = threading.Condition()
        self.faults: list[Fault] = []
        self.requests: list[tuple[str, str]] = []  # (method, path) of every request
        self.watch_linger_s: float | None = None  # close an idle watch after this long
        self._stopping = False
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
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

        A "reset" of a watch request sends the stream's first events, then resets.
        """
        fault = Fault(kind, re.compile(path), method, count, retry_after, delay_s, watch)
        with self.cond:
            self.faults.append(fault)

    def compact(self) -> None:
        """Forget history: a watch from any version before now answers 410 Gone."""
        with self.cond:
            self.state.compacted_rv = self.state.rv
            self.state.events.clear()

    def end_watches(self) -> None:
        """Close every open watch stream without an error event (a silent end)."""
        with self.cond:
            self.state.watch_generation += 1
            self.cond.notify_all()

    def add_namespace(self, name: str, labels: dict[str, str] | None = None) -> Obj:
        body = {"metadata": {"name": name, "labels": labels or {}}}
        return self.create("namespaces", "", body)

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
            key = (resource, namespace, name)
            if key in self.state.objects:
                raise ApiError(409, "AlreadyExists", f'{resource} "{name}" already exists')
            if resource == "pods":
                self._admit_pod(namespace, body)
                body.setdefault("status", {"phase": "Pending"})
            meta |= {"uid": str(uuid.uuid4()), "creationTimestamp": _now()}
            if namespace:
                meta["namespace"] = namespace
            self.state.objects[key] = body
            self._bump(resource, "ADDED", body)
            return copy.deepcopy(body)

    def _admit_pod(self, namespace: str, pod: Obj) -> None:
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
                f'"restricted:latest": {"; ".join(problems)}',
            )

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
            self._check_version(current, body, name)
            return self._write(resource, current, merge_patch(copy.deepcopy(current), body))

    def _write(self, resource: str, current: Obj, new: Obj) -> Obj:
        if resource == "pods":
            frozen = ("containers", "nodeName", "schedulerName", "securityContext", "volumes")
            if any(current["spec"].get(k) != new.get("spec", {}).get(k) for k in frozen):
                raise ApiError(422, "Invalid", "spec: Forbidden: pod updates may not change fields")
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
            if obj["spec"].get("nodeName") and grace > 0:
                meta = obj["metadata"]
                if not meta.get("deletionTimestamp"):
                    meta |= {"deletionTimestamp": _now(), "deletionGracePeriodSeconds": grace}
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
            pod["spec"]["nodeName"] = target
            pod["status"].setdefault("conditions", []).append(
                {"type": "PodScheduled", "status": "True"}
            )
            self._bump("pods", "MODIFIED", pod)
            return status_body(201, "", "")

    def list_objects(self, resource: str, namespace: str, query: dict[str, str]) -> Obj:
        with self.cond:
            items = self._matching(resource, namespace, query)
            offset = _decode_continue(query.get("continue", ""))
            limit = int(query.get("limit") or 0) or len(items) or 1
            page = items[offset : offset + limit]
            meta: Obj = {"resourceVersion": str(self.state.rv)}
            if offset + limit < len(items):
                meta["continue"] = _encode_continue(offset + limit)
            kind = resource[:-1].capitalize() + "List"
            return {"kind": kind, "apiVersion": "v1", "metadata": meta, "items": page}

    def _matching(self, resource: str, namespace: str, query: dict[str, str]) -> list[Obj]:
        keys = sorted(k for k in self.state.objects if k[0] == resource)
        return [
            copy.deepcopy(self.state.objects[k])
            for k in keys
            if (not namespace or k[1] == namespace) and selected(self.state.objects[k], query)
        ]


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
    """The restricted Pod Security Standard checks that matter for Gantry's pods."""
    spec = pod.get("spec") or {}
    problems = []
    if spec.get("hostNetwork") or spec.get("hostPID") or spec.get("hostIPC"):
        problems.append("host namespaces")
    if any("hostPath" in v for v in spec.get("volumes") or ()):
        problems.append("hostPath volumes")
    pod_sc = spec.get("securityContext") or {}
    for c in spec.get("containers") or ():
        sc = c.get("securityContext") or {}
        name = c.get("name")
        if sc.get("privileged"):
            problems.append(f"privileged (container {name!r})")
        if sc.get("allowPrivilegeEscalation") is not False:
            problems.append(f"allowPrivilegeEscalation != false (container {name!r})")
        caps = sc.get("capabilities") or {}
        if "ALL" not in (caps.get("drop") or ()):
            problems.append(f"unrestricted capabilities (container {name!r})")
        if set(caps.get("add") or ()) - {"NET_BIND_SERVICE"}:
            problems.append(f"added capabilities (container {name!r})")
        if not (sc.get("runAsNonRoot") or pod_sc.get("runAsNonRoot")):
            problems.append(f"runAsNonRoot != true (container {name!r})")
        if 0 in (sc.get("runAsUser"), pod_sc.get("runAsUser")):
            problems.append(f"runAsUser=0 (container {name!r})")
        seccomp = (sc.get("seccompProfile") or pod_sc.get("seccompProfile") or {}).get("type")
        if seccomp not in ("RuntimeDefault", "Localhost"):
            problems.append(f"seccompProfile (container {name!r})")
    return problems


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _encode_continue(offset: int) -> str:
    return base64.urlsafe_b64encode(json.dumps({"offset": offset}).encode()).decode()


def _decode_continue(token: str) -> int:
    return int(json.loads(base64.urlsafe_b64decode(token))["offset"]) if token else 0


# -- HTTP -------------------------------------------------------------------------------------

_COLLECTION = re.compile(r"^/api/v1/(?:namespaces/(?P<ns>[^/]+)/)?(?P<res>[a-z]+)$")
_ITEM = re.compile(
    r"^/api/v1/(?:namespaces/(?P<ns>[^/]+)/)?(?P<res>[a-z]+)/(?P<name>[^/]+)(?:/(?P<sub>[a-z]+))?$"
)


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True  # headers and body go out as two writes
    server: Any

    def log_message(self, format: str, *args: Any) -> None:
        return

    def do_GET(self) -> None:
        self._handle("GET")

    def do_POST(self) -> None:
        self._handle("POST")

    def do_PUT(self) -> None:
        self._handle("PUT")

    def do_PATCH(self) -> None:
        self._handle("PATCH")

    def do_DELETE(self) -> None:
        self._handle("DELETE")

    def _handle(self, method: str) -> None:
        fake: FakeApiServer = self.server.fake
        url = urlsplit(self.path)
        query = {k: v[-1] for k, v in parse_qs(url.query).items()}
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        body = json.loads(raw) if raw else {}
        watching = query.get("watch") in ("true", "1")
        with fake.cond:
            fake.requests.append((method, url.path))
            fault = self._take_fault(fake, method, url.path, watching)
        if fault is not None and fault.kind == "lost" and not watching:
            with contextlib.suppress(ApiError):  # the write happens; its answer never arrives
                self._route(fake, method, url.path, query, body)
            self._reset()
            return
        if fault is not None and not (fault.kind == "reset" and watching):
            self._fail(fault)
            return
        try:
            if watching:
                self._watch(fake, url.path, query, reset=fault is not None)
                return
            code, payload = self._route(fake, method, url.path, query, body)
        except ApiError as exc:
            code, payload = exc.code, status_body(exc.code, exc.reason, exc.message)
        self._json(code, payload)

    @staticmethod
    def _take_fault(fake: FakeApiServer, method: str, path: str, watching: bool) -> Fault | None:
        for fault in fake.faults:
            if (
                fault.remaining > 0
                and fault.path.search(path)
                and fault.method in (None, method)
                and fault.watch in (None, watching)
            ):
                fault.remaining -= 1
                return fault
        return None

    def _fail(self, fault: Fault) -> None:
        if fault.kind == "timeout":
            time.sleep(fault.delay_s)  # longer than the client's read timeout
            self._reset()
        elif fault.kind == "reset":
            self._reset()
        else:
            code = int(fault.kind)
            headers = {"Retry-After": str(fault.retry_after)} if code == 429 else {}
            reason = {429: "TooManyRequests", 500: "InternalError", 503: "ServiceUnavailable"}
            self._json(code, status_body(code, reason.get(code, ""), "injected"), headers)

    def _reset(self) -> None:
        # SO_LINGER 0: close() sends RST, the client sees "connection reset by peer".
        self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        self.close_connection = True
        self.connection.close()

    def _json(self, code: int, payload: Obj, headers: dict[str, str] | None = None) -> None:
        data = json.dumps(payload).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        for key, value in (headers or {}).items():
            self.send_header(key, value)
        self.end_headers()
        self.wfile.write(data)

    def _route(
        self, fake: FakeApiServer, method: str, path: str, query: dict[str, str], body: Obj
    ) -> tuple[int, Obj]:
        collection = _COLLECTION.match(path)
        if collection and collection["res"] in CLUSTER_SCOPED | NAMESPACED:
            ns, res = collection["ns"] or "", collection["res"]
            if method == "GET":
                return 200, fake.list_objects(res, ns, query)
            if method == "POST":
                return 201, fake.create(res, ns, body)
        item = _ITEM.match(path)
        if item and item["res"] in CLUSTER_SCOPED | NAMESPACED:
            ns, res, name, sub = item["ns"] or "", item["res"], item["name"], item["sub"]
            if sub == "binding" and res == "pods" and method == "POST":
                return 201, fake.bind(ns, name, body)
            if sub is None:
                return self._item(fake, method, res, ns, name, query, body)
        raise ApiError(404, "NotFound", f"the server could not find the requested resource {path}")

    @staticmethod
    def _item(
        fake: FakeApiServer,
        method: str,
        res: str,
        ns: str,
        name: str,
        query: dict[str, str],
        body: Obj,
    ) -> tuple[int, Obj]:
        if method == "GET":
            with fake.cond:
                return 200, copy.deepcopy(fake._existing(res, ns, name))
        if method == "PUT":
            return 200, fake.replace(res, ns, name, body)
        if method == "PATCH":
            return 200, fake.patch(res, ns, name, body)
        if method == "DELETE":
            grace = query.get("gracePeriodSeconds", body.get("gracePeriodSeconds"))
            return 200, fake.delete(res, ns, name, None if grace is None else int(grace))
        raise ApiError(405, "MethodNotAllowed", method)

    def _watch(self, fake: FakeApiServer, path: str, query: dict[str, str], reset: bool) -> None:
        match = _COLLECTION.match(path)
        if not match:
            raise ApiError(404, "NotFound", path)
        ns, res = match["ns"] or "", match["res"]
        deadline = time.monotonic() + float(query.get("timeoutSeconds") or 1800)
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        with fake.cond:
            generation = fake.state.watch_generation
            since = int(query.get("resourceVersion") or 0)
            if since and since < fake.state.compacted_rv:
                gone = status_body(410, "Expired", f"too old resource version: {since}")
                self._chunk({"type": "ERROR", "object": gone})
                self._chunk(None)
                return
            backlog = self._initial(fake, res, ns, query, since)
        for event in backlog:
            self._chunk(event)
        if reset:
            self._reset()
            return
        self._stream(fake, res, ns, query, max(since, fake.state.rv), generation, deadline)

    def _initial(
        self, fake: FakeApiServer, res: str, ns: str, query: dict[str, str], since: int
    ) -> list[Obj]:
        if not since:  # no version: the current state as ADDED events, then changes
            return [{"type": "ADDED", "object": o} for o in fake._matching(res, ns, query)]
        return self._since(fake, res, ns, query, since)

    @staticmethod
    def _since(
        fake: FakeApiServer, res: str, ns: str, query: dict[str, str], since: int
    ) -> list[Obj]:
        return [
            {"type": e.type, "object": copy.deepcopy(e.obj)}
            for e in fake.state.events
            if e.rv > since
            and e.resource == res
            and (not ns or e.obj["metadata"].get("namespace") == ns)
            and selected(e.obj, query)
        ]

    def _stream(
        self,
        fake: FakeApiServer,
        res: str,
        ns: str,
        query: dict[str, str],
        since: int,
        generation: int,
        deadline: float,
    ) -> None:
        idle_since = time.monotonic()
        while True:
            with fake.cond:
                linger = fake.watch_linger_s
                fake.cond.wait(timeout=0.05 if linger is None else min(linger, 0.05))
                if fake._stopping or fake.state.watch_generation != generation:
                    break
                events = self._since(fake, res, ns, query, since)
                since = fake.state.rv
            now = time.monotonic()
            if events:
                idle_since = now
            try:
                for event in events:
                    self._chunk(event)
            except OSError:
                return
            if now >= deadline or (linger is not None and now - idle_since >= linger):
                break
        try:
            self._chunk(None)
        except OSError:
            return

    def _chunk(self, event: Obj | None) -> None:
        data = b"" if event is None else json.dumps(event).encode() + b"\n"
        self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
        self.wfile.flush()
