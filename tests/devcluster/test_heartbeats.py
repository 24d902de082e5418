"""The simulated kubelets' heartbeats (devcluster.heartbeats over devcluster.fanout), against a
small HTTP server that keeps leases as the API server does and misbehaves on command: it closes
kept-alive connections, and fails one node's requests."""

from __future__ import annotations

import json
import threading
import urllib.parse
import zlib
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.rest import ApiException

from devcluster.fanout import Fanout, Request
from devcluster.heartbeats import STATUS_ROUNDS, heartbeat_round
from devcluster.kubelets import Kubelets

LEASES = "/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases"


class Server(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), Handler)
        self.lock = threading.RLock()
        self.leases: dict[str, dict[str, Any]] = {}
        self.reported: list[str] = []  # nodes whose status was reported, in order
        self.failing: set[str] = set()  # nodes whose every request answers 500
        self.close_every = 0  # drop the connection after every n-th answer (0: never)
        self.answered = 0
        self.authorizations: set[str | None] = set()
        self.not_ready: set[str] = set()  # nodes the node lifecycle controller marked
        self.listed: list[str] = []  # the label selectors of node lists
        self.on_answer: Any = None  # called at each node list but the first
        # Leases another round creates right after this one found them missing (404)
        self.created_meanwhile: set[str] = set()


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, as the API server
    # An answer's head and body in one write, as the API server sends them: in two, Nagle's
    # algorithm and the client's delayed ACK hold each answer ~40 ms.
    wbufsize = 1 << 16
    disable_nagle_algorithm = True
    server: Server

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def do_PATCH(self) -> None:
        body = self._body()
        name = self.path.rsplit("/", 1)[-1] if self.path.startswith(LEASES) else ""
        if self.path.startswith("/api/v1/nodes/"):
            node = self.path.split("/")[4]
            if node in self.server.failing:
                return self._answer(500, {"message": "etcd timeout"})
            with self.server.lock:
                self.server.reported.append(node)
                self.server.not_ready.discard(node)
            return self._answer(200, {})
        if name in self.server.failing:
            return self._answer(500, {"message": "etcd timeout"})
        with self.server.lock:
            if name not in self.server.leases:
                if name in self.server.created_meanwhile:
                    self.server.created_meanwhile.discard(name)
                    self.server.leases[name] = {"renewTime": "by the other round"}
                return self._answer(404, {"reason": "NotFound"})
            self.server.leases[name] |= body["spec"]
        return self._answer(200, {})

    def do_GET(self) -> None:
        url = urllib.parse.urlsplit(self.path)
        if url.path != "/api/v1/nodes":
            return self._answer(404, {"reason": "NotFound"})
        self.server.listed.append(urllib.parse.parse_qs(url.query)["labelSelector"][0])
        if self.server.on_answer is not None and self.server.listed[1:]:
            self.server.on_answer()
        items = [
            {
                "metadata": {"name": name},
                "status": {
                    "conditions": [
                        {
                            "type": "Ready",
                            "status": "Unknown" if name in self.server.not_ready else "True",
                        }
                    ]
                },
            }
            for name in self.server.leases
        ]
        return self._answer(200, {"items": items})

    def do_POST(self) -> None:
        body = self._body()
        with self.server.lock:
            name = body["metadata"]["name"]
            if name in self.server.leases:
                return self._answer(409, {"reason": "AlreadyExists"})
            self.server.leases[name] = dict(body["spec"])
        return self._answer(201, {})

    def _body(self) -> dict[str, Any]:
        self.server.authorizations.add(self.headers.get("Authorization"))
        loaded: dict[str, Any] = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        return loaded

    def _answer(self, status: int, body: dict[str, Any]) -> None:
        data = json.dumps(body).encode()
        with self.server.lock:
            self.server.answered += 1
            closing = (
                self.server.close_every and self.server.answered % self.server.close_every == 0
            )
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)
        if closing:  # no "Connection: close": the client learns on its next request
            self.close_connection = True


@pytest.fixture
def server() -> Iterator[Server]:
    served = Server()
    thread = threading.Thread(target=served.serve_forever, daemon=True)
    thread.start()
    yield served
    served.shutdown()
    served.server_close()
    thread.join()


def configuration(server: Server, token: str | None = None) -> client.Configuration:
    config = client.Configuration()
    config.host = f"http://127.0.0.1:{server.server_address[1]}"
    if token:
        config.api_key = {"authorization": token}
        config.api_key_prefix = {"authorization": "Bearer"}
    return config


NODES = [f"sim-{i:03d}" for i in range(60)]


def test_a_round_renews_every_lease_and_creates_the_missing_ones(server: Server) -> None:
    server.leases = {name: {"renewTime": "old"} for name in NODES[:20]}
    assert heartbeat_round(Fanout(configuration(server)), NODES, 0) == []
    assert sorted(server.leases) == NODES
    for lease in server.leases.values():
        assert lease["holderIdentity"] in NODES and lease["leaseDurationSeconds"] == 40
        assert lease["renewTime"] != "old"


def test_a_lease_another_round_created_meanwhile_is_renewed_not_a_failure(
    server: Server,
) -> None:
    # bench.k8s_peers registers nodes in several threads, each beating the nodes it added,
    # while the periodic round beats every node: both find a new lease missing, and the
    # second create answers 409 (a registration failed so at 5,000 nodes on 2026-12-07).
    server.created_meanwhile = set(NODES[:5])
    assert heartbeat_round(Fanout(configuration(server)), NODES, 0) == []
    assert sorted(server.leases) == NODES
    assert all(lease["renewTime"] != "by the other round" for lease in server.leases.values())


def test_connections_the_server_closed_are_opened_again(server: Server) -> None:
    server.close_every = 3
    assert heartbeat_round(Fanout(configuration(server), connections=4), NODES, 0) == []
    assert sorted(server.leases) == NODES


def test_a_failing_node_is_named_and_the_others_are_renewed(server: Server) -> None:
    server.failing = {"sim-007"}
    kubelets = Kubelets(client.ApiClient(configuration(server)))
    kubelets.nodes.update(NODES)
    with pytest.raises(ApiException, match="sim-007") as failed:
        kubelets.heartbeat()
    assert failed.value.status == 500
    assert sorted(server.leases) == [n for n in NODES if n != "sim-007"]


def test_a_lost_node_stops_heartbeating(server: Server) -> None:
    kubelets = Kubelets(client.ApiClient(configuration(server)))
    kubelets.nodes.update(NODES)
    kubelets.lost.add("sim-001")
    kubelets.heartbeat()
    assert "sim-001" not in server.leases and len(server.leases) == len(NODES) - 1


def test_each_node_reports_its_status_once_in_status_rounds(server: Server) -> None:
    fanout = Fanout(configuration(server), connections=2)
    few = NODES[:12]
    for number in range(STATUS_ROUNDS):
        assert heartbeat_round(fanout, few, number) == []
    assert sorted(server.reported) == few


def test_a_node_the_controller_marked_reports_its_status_at_once(server: Server) -> None:
    kubelets = Kubelets(client.ApiClient(configuration(server)))
    kubelets.nodes.update(NODES)
    kubelets.heartbeat()  # every lease made
    server.reported.clear()
    # Its turn to report comes neither in the first round (0) nor in the next (1).
    marked = next(n for n in NODES if zlib.crc32(n.encode()) % STATUS_ROUNDS not in (0, 1))
    server.not_ready = {marked}
    kubelets.heartbeat()
    assert marked in server.reported and server.not_ready == set()
    assert server.listed == ["devcluster.gantry.dev/simulated=true"] * 2


def test_the_bearer_token_is_sent(server: Server) -> None:
    fanout = Fanout(configuration(server, token="s3cret"))
    (answer,) = fanout.send([Request("POST", LEASES, {"metadata": {"name": "a"}, "spec": {}})])
    assert answer.status == 201
    assert server.authorizations == {"Bearer s3cret"}


def test_a_server_that_is_gone_answers_status_0(server: Server) -> None:
    fanout = Fanout(configuration(server))
    server.shutdown()
    server.server_close()
    (answer,) = fanout.send([Request("PATCH", f"{LEASES}/a", {"spec": {}})])
    assert answer.status == 0


def test_beat_goes_on_after_a_failed_round_and_times_the_good_ones(server: Server) -> None:
    kubelets = Kubelets(client.ApiClient(configuration(server)))
    kubelets.nodes.update(NODES[:5])
    server.failing = {"sim-001"}
    stop = threading.Event()
    timed: list[float] = []

    def heard(seconds: float) -> None:
        timed.append(seconds)
        stop.set()

    # The first round fails (logged); the second round's node list heals the server, so that
    # round succeeds, is timed, and stops the loop.
    server.on_answer = server.failing.clear
    kubelets.beat(stop, interval_s=0.0, on_round=heard)
    assert len(timed) == 1 and timed[0] >= 0
    assert sorted(server.leases) == NODES[:5]
