"""The HTTP face of the fake apiserver: routing, faults, chunked watch streams."""

from __future__ import annotations

import contextlib
import copy
import json
import re
import socket
import struct
import time
from http.server import BaseHTTPRequestHandler
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qs, urlsplit

from tests.k8s.fake_rules import (
    CLUSTER_SCOPED,
    JSON_PATCH,
    NAMESPACED,
    ApiError,
    Obj,
    selected,
    status_body,
)

if TYPE_CHECKING:
    from tests.k8s.fake_apiserver import FakeApiServer, Fault

# -- routing -------------------------------------------------------------------------------------

# The core group, the groups of a project namespace's NetworkPolicies and RoleBinding,
# batch and the custom kinds at their CRDs' versions (the workloads users create, issue 37).
_PREFIX = (
    r"^(?:/api/v1|/apis/(?:networking|rbac\.authorization)\.k8s\.io/v1|/apis/batch/v1"
    r"|/apis/jobset\.x-k8s\.io/v1alpha2|/apis/leaderworkerset\.x-k8s\.io/v1|/apis/ray\.io/v1"
    r"|/apis/trainer\.kubeflow\.org/v1alpha1|/apis/kubeflow\.org/v1)/"
)
_COLLECTION = re.compile(_PREFIX + r"(?:namespaces/(?P<ns>[^/]+)/)?(?P<res>[a-z]+)$")
_ITEM = re.compile(
    _PREFIX + r"(?:namespaces/(?P<ns>[^/]+)/)?(?P<res>[a-z]+)/(?P<name>[^/]+)(?:/(?P<sub>[a-z]+))?$"
)

_LOG = re.compile(r"^/api/v1/namespaces/(?P<ns>[^/]+)/pods/(?P<name>[^/]+)/log$")


def _as_asked(accept: str, code: int, payload: Obj) -> Obj:
    """An object's answer as the client asked for it: `as=PartialObjectMetadata` in Accept
    gets its metadata alone, as the real API server transforms it (lists and errors as they
    are: nothing here asks for those so)."""
    whole = code >= 300 or payload.get("kind") == "Status" or "items" in payload
    if whole or "as=PartialObjectMetadata" not in accept:
        return payload
    return {
        "kind": "PartialObjectMetadata",
        "apiVersion": "meta.k8s.io/v1",
        "metadata": payload.get("metadata") or {},
    }


class Handler(BaseHTTPRequestHandler):
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
        if method == "PATCH" and "json-patch" in (self.headers.get("Content-Type") or ""):
            body = {JSON_PATCH: body}  # a list of operations, applied by `fake.patch`
        watching = query.get("watch") in ("true", "1")
        with fake.cond:
            fake.requests.append((method, url.path))
            fault = self._take_fault(fake, method, url.path, watching)
        if fault is not None and fault.kind == "lost" and not watching:
            with contextlib.suppress(ApiError):  # the write happens; its answer never arrives
                self._route(fake, method, url.path, query, body)
            self._reset()
            return
        log = _LOG.match(url.path) if method == "GET" else None
        streaming = watching or bool(log and query.get("follow") in ("true", "1"))
        if fault is not None and not (fault.kind in ("reset", "stall") and streaming):
            self._fail(fault)
            return
        try:
            if watching:
                kind = fault.kind if fault is not None else None
                self._watch(fake, url.path, query, reset=kind == "reset", stall=kind == "stall")
                return
            if log:
                self._log(fake, log["ns"], log["name"], query, reset=fault is not None)
                return
            code, payload = self._route(fake, method, url.path, query, body)
        except ApiError as exc:
            code, payload = exc.code, status_body(exc.code, exc.reason, exc.message)
        self._json(code, _as_asked(self.headers.get("Accept") or "", code, payload))

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
            if method == "DELETE":  # deletecollection: each listed object, as one DELETE
                grace = query.get("gracePeriodSeconds", body.get("gracePeriodSeconds"))
                listed = fake.list_objects(res, ns, query)
                for obj in listed["items"]:
                    meta = obj["metadata"]
                    fake.delete(
                        res, meta.get("namespace") or "", meta["name"],
                        None if grace is None else int(grace),
                    )  # fmt: skip
                return 200, listed
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

    def _log(
        self, fake: FakeApiServer, ns: str, name: str, query: dict[str, str], reset: bool = False
    ) -> None:
        """pods/log: plain text; with follow, chunks as lines come until the pod ends (with
        `reset`, the lines so far, then the connection is reset mid-stream)."""
        with fake.cond:
            lines = fake.pod_log(ns, name, query)
            written = len(fake.state.logs.get((ns, name), []))
            bound = bool(fake._existing("pods", ns, name)["spec"].get("nodeName"))
        if not bound:
            # No node, no kubelet to ask: the real apiserver answers 204 No Content at once,
            # followed or not (it does not hold a follow open until the pod is bound).
            self.send_response(204)
            self.end_headers()
            return
        data = "".join(f"{line}\n" for line in lines).encode()
        if query.get("limitBytes"):
            data = data[: int(query["limitBytes"])]
        if query.get("follow") not in ("true", "1"):
            self.send_response(200)
            self.send_header("Content-Type", "text/plain")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)
            return
        self.send_response(200)
        self.send_header("Content-Type", "text/plain")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        self._raw_chunk(data)
        if reset:
            self._reset()
            return
        while True:
            with fake.cond:
                fake.cond.wait(timeout=0.05)
                if fake._stopping:
                    break
                try:
                    more = fake.pod_log(ns, name, {**query, "tailLines": ""}, start=written)
                except ApiError:
                    more = []
                written += len(more)
                ended = fake.pod_ended(ns, name)
            try:
                self._raw_chunk("".join(f"{line}\n" for line in more).encode())
            except OSError:
                return
            if ended:
                break
        try:
            self.wfile.write(b"0\r\n\r\n")
            self.wfile.flush()
        except OSError:
            return

    def _raw_chunk(self, data: bytes) -> None:
        if data:
            self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
            self.wfile.flush()

    def _watch(
        self,
        fake: FakeApiServer,
        path: str,
        query: dict[str, str],
        reset: bool,
        stall: bool = False,
    ) -> None:
        """A watch stream; `stall`: it sends its backlog, then nothing more while it stays
        open (a proxy that stopped forwarding): what it misses only a list finds."""
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
        with fake.cond:
            fake.streaming[res] = fake.streaming.get(res, 0) + 1
        try:
            since = max(since, fake.state.rv)
            self._stream(fake, res, ns, query, since, generation, deadline, stall=stall)
        finally:
            with fake.cond:
                fake.streaming[res] -= 1

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
        *,
        stall: bool = False,
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
                for event in [] if stall else events:
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
