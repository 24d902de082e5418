"""Many small requests to the API server at once, for the simulated kubelets' heartbeats.

A kubelet renews its node's Lease every 10 s; the node lifecycle controller marks a node
NotReady (and taints it) once neither its Lease nor its status moved within its grace period
(`--node-monitor-grace-period`). Thousands of simulated nodes must therefore be renewed well
within that period, from one Python process on a small machine, beside the API server itself.
What limits a round is this process's own time per request, not the server's: the typed client
builds and checks each call in Python (sanitising, headers, its urllib3 pool), and one
connection waits out every round trip. `Fanout` sends each request as a few bytes over
`connections` keep-alive HTTPS connections of its own (the standard library's http.client), one
thread each, so the waits overlap and the per-request Python is a fraction of the typed
client's. bench/k8s_peers.py prints one round's time (`heartbeat_s`).

The connections authenticate as the typed client's configuration does (client certificate or
bearer token), and verify the server as it does.
"""

from __future__ import annotations

import http.client
import json
import ssl
import urllib.parse
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from kubernetes import client

Obj = dict[str, Any]
TIMEOUT_S = 30.0
MERGE_PATCH = "application/merge-patch+json"
STRATEGIC_PATCH = "application/strategic-merge-patch+json"


@dataclass(frozen=True)
class Request:
    method: str
    path: str
    body: Obj | None = None  # sent again if its connection failed: idempotent requests only
    content_type: str = "application/json"


@dataclass(frozen=True)
class Answer:
    status: int  # 0: no answer (the connection failed twice)
    body: bytes


class Fanout:
    """Sends a batch of requests over connections of its own, opened for the batch and closed
    after it: a round every few seconds pays a few TLS handshakes, and nothing outlives it
    (no pool to close, no thread left behind)."""

    def __init__(self, configuration: client.Configuration, connections: int = 8) -> None:
        url = urllib.parse.urlsplit(configuration.host)
        self.secure = url.scheme == "https"
        self.host = url.hostname or "localhost"
        self.port = url.port or (443 if self.secure else 80)
        self.prefix = url.path.rstrip("/")
        self.connections = connections
        self.headers = {"Accept": "application/json", "Connection": "keep-alive"}
        token = configuration.get_api_key_with_prefix("authorization")
        if token:
            self.headers["Authorization"] = token
        self.context = _ssl_context(configuration) if self.secure else None

    def send(self, requests: Sequence[Request]) -> list[Answer]:
        """Every request sent, `connections` at a time; the answers in the requests' order.
        A request whose connection failed twice answers status 0."""
        if not requests:
            return []
        width = min(self.connections, len(requests))
        slices = [requests[i::width] for i in range(width)]
        answers: list[Answer] = [Answer(0, b"")] * len(requests)
        with ThreadPoolExecutor(width, thread_name_prefix="fanout") as pool:
            for i, sent in enumerate(pool.map(self._send_all, slices)):
                answers[i::width] = sent
        return answers

    def _send_all(self, requests: Sequence[Request]) -> list[Answer]:
        connection = self._connect()
        try:
            answers = []
            for request in requests:
                answer, connection = self._send(connection, request)
                answers.append(answer)
            return answers
        finally:
            connection.close()

    def _send(
        self, connection: http.client.HTTPConnection, request: Request
    ) -> tuple[Answer, http.client.HTTPConnection]:
        body = None if request.body is None else json.dumps(request.body).encode()
        headers = {**self.headers, "Content-Type": request.content_type}
        for _attempt in (1, 2):  # a kept-alive connection the server closed: once more
            try:
                connection.request(request.method, self.prefix + request.path, body, headers)
                response = connection.getresponse()
                return Answer(response.status, response.read()), connection
            except (OSError, http.client.HTTPException):
                connection.close()
                connection = self._connect()
        return Answer(0, b""), connection

    def _connect(self) -> http.client.HTTPConnection:
        if self.secure:
            return http.client.HTTPSConnection(
                self.host, self.port, timeout=TIMEOUT_S, context=self.context
            )
        return http.client.HTTPConnection(self.host, self.port, timeout=TIMEOUT_S)


def _ssl_context(configuration: client.Configuration) -> ssl.SSLContext:
    context = ssl.create_default_context(cafile=configuration.ssl_ca_cert or None)
    if not configuration.verify_ssl:
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    if configuration.cert_file:
        context.load_cert_chain(configuration.cert_file, configuration.key_file)
    return context
