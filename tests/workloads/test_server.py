"""The webhook over TLS (scheduler/workloads/server.py): what a caller sees on the wire."""

from __future__ import annotations

import http.client
import json
import os
import shutil
import socket
import ssl
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from scheduler.workloads import kinds, server
from scheduler.workloads.server import MAX_BODY_BYTES, WebhookServer
from tests.workloads.builders import applied, obj, ops_of, review, template
from tests.workloads.tls import ServingPair, serving_pair

DAEMON = "system:serviceaccount:gantry-system:gantry-scheduler"


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> ServingPair:
    return serving_pair(tmp_path_factory.mktemp("webhook-pki"))


@pytest.fixture
def webhook(pair: ServingPair) -> Iterator[WebhookServer]:
    running = WebhookServer(("127.0.0.1", 0), pair.cert, pair.key, exempt_users=[DAEMON])
    running.start()
    yield running
    running.stop()


OPEN: list[http.client.HTTPConnection] = []


@pytest.fixture(autouse=True)
def _closed() -> Iterator[None]:
    """Every client connection a test opened is closed after it (an unclosed one is a
    ResourceWarning, an error here)."""
    yield
    while OPEN:
        OPEN.pop().close()


def _connect(webhook: WebhookServer, pair: ServingPair) -> http.client.HTTPSConnection:
    conn = http.client.HTTPSConnection(
        "127.0.0.1", webhook.port, context=pair.client_context(), timeout=30
    )
    OPEN.append(conn)
    return conn


def _post(conn: http.client.HTTPSConnection, body: bytes) -> tuple[int, bytes]:
    conn.request("POST", "/mutate", body=body, headers={"Content-Type": "application/json"})
    response = conn.getresponse()
    return response.status, response.read()


def _job() -> dict[str, Any]:
    return obj(kinds.JOB, "train", {"template": template()})


def test_a_job_is_answered_with_its_patch_over_tls(
    webhook: WebhookServer, pair: ServingPair
) -> None:
    incoming = review(kinds.JOB, _job(), user="alice")
    conn = _connect(webhook, pair)
    status, body = _post(conn, json.dumps(incoming).encode())
    answer = json.loads(body)
    assert status == 200
    assert answer["response"]["uid"] == incoming["request"]["uid"]
    stored = applied(answer, _job())
    assert stored["spec"]["suspend"] is True
    assert stored["spec"]["template"]["spec"]["schedulerName"] == "gantry"
    # The connection is kept alive, as the API server keeps it: a second review on it.
    status, body = _post(conn, json.dumps(review(kinds.POD, obj(kinds.POD, "p", {}))).encode())
    assert status == 200 and ops_of(json.loads(body))
    conn.close()


def test_the_exempt_user_passes_unchanged(webhook: WebhookServer, pair: ServingPair) -> None:
    status, body = _post(
        _connect(webhook, pair), json.dumps(review(kinds.JOB, _job(), user=DAEMON)).encode()
    )
    assert status == 200 and ops_of(json.loads(body)) == []


def test_healthz(webhook: WebhookServer, pair: ServingPair) -> None:
    conn = _connect(webhook, pair)
    conn.request("GET", "/healthz")
    response = conn.getresponse()
    assert (response.status, response.read()) == (200, b"ok")
    conn.request("GET", "/mutate")
    assert conn.getresponse().status == 404


@pytest.mark.parametrize("body", [b"not json", b"[]", b'{"request": {"uid": 3}}', b"\xff\xfe"])
def test_an_unreadable_review_is_allowed_without_a_patch(
    webhook: WebhookServer, pair: ServingPair, body: bytes
) -> None:
    status, answer = _post(_connect(webhook, pair), body)
    assert status == 200
    assert json.loads(answer)["response"] == {"uid": "", "allowed": True}


def test_a_body_over_the_limit_is_refused_before_it_is_read(
    webhook: WebhookServer, pair: ServingPair
) -> None:
    conn = _connect(webhook, pair)
    conn.putrequest("POST", "/mutate")
    conn.putheader("Content-Length", str(MAX_BODY_BYTES + 1))
    conn.endheaders()  # and no body: the answer comes without it
    response = conn.getresponse()
    assert response.status == 413
    assert str(MAX_BODY_BYTES) in response.read().decode()


def test_a_post_without_a_length_is_refused(webhook: WebhookServer, pair: ServingPair) -> None:
    conn = _connect(webhook, pair)
    conn.putrequest("POST", "/mutate")
    conn.putheader("Transfer-Encoding", "chunked")
    conn.endheaders()
    assert conn.getresponse().status == 411


def test_a_fault_of_ours_is_a_500_so_the_failure_policy_applies(pair: ServingPair) -> None:
    def broken(review: Any) -> dict[str, Any]:
        raise RuntimeError("a bug")

    running = WebhookServer(("127.0.0.1", 0), pair.cert, pair.key, decide=broken)
    running.start()
    try:
        status, _ = _post(_connect(running, pair), json.dumps(review(kinds.JOB, _job())).encode())
    finally:
        running.stop()
    assert status == 500


def test_a_client_stalled_before_its_handshake_holds_nobody_else(
    webhook: WebhookServer, pair: ServingPair
) -> None:
    """The handshake happens in the connection's thread: a silent client does not stop the
    accepting one from serving the API server."""
    with socket.create_connection(("127.0.0.1", webhook.port)) as silent:
        status, _ = _post(_connect(webhook, pair), json.dumps(review(kinds.JOB, _job())).encode())
        assert status == 200
        silent.sendall(b"")  # still open


def test_plain_http_gets_no_answer_and_the_server_goes_on(
    webhook: WebhookServer, pair: ServingPair
) -> None:
    plain = http.client.HTTPConnection("127.0.0.1", webhook.port, timeout=30)
    OPEN.append(plain)
    with pytest.raises((http.client.HTTPException, ConnectionError)):
        plain.request("GET", "/healthz")
        plain.getresponse()
    conn = _connect(webhook, pair)
    conn.request("GET", "/healthz")
    assert conn.getresponse().status == 200


def test_a_client_that_trickles_its_body_is_dropped(
    pair: ServingPair, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A body that never completes is not waited for past the read deadline: the connection
    closes with no answer (the API server, past its own timeout, has given up already)."""
    monkeypatch.setattr(server, "READ_TIMEOUT_S", 0.2)
    running = WebhookServer(("127.0.0.1", 0), pair.cert, pair.key)
    running.start()
    try:
        raw = socket.create_connection(("127.0.0.1", running.port), timeout=30)
        tls = pair.client_context().wrap_socket(raw, server_hostname="127.0.0.1")
        tls.sendall(b"POST /mutate HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{")
        assert tls.recv(1024) == b""  # closed by the server, nothing said
        tls.close()
    finally:
        running.stop()


def test_the_certificate_is_checked_by_the_client(webhook: WebhookServer, tmp_path: Path) -> None:
    """The API server trusts the caBundle only: another CA's client refuses the server."""
    other = serving_pair(tmp_path / "other")
    conn = http.client.HTTPSConnection(
        "127.0.0.1", webhook.port, context=other.client_context(), timeout=30
    )
    OPEN.append(conn)
    with pytest.raises(ssl.SSLCertVerificationError):
        conn.request("GET", "/healthz")


def test_stopped_means_no_answer_on_a_kept_alive_connection_either(pair: ServingPair) -> None:
    """The API server keeps its connection alive: a webhook stopped (a pod ending) must not go
    on answering on it, or "down" would be down for new connections only."""
    running = WebhookServer(("127.0.0.1", 0), pair.cert, pair.key)
    running.start()
    conn = _connect(running, pair)
    assert _post(conn, json.dumps(review(kinds.JOB, _job())).encode())[0] == 200
    running.stop()
    with pytest.raises((http.client.HTTPException, ConnectionError, ssl.SSLError)):
        _post(conn, json.dumps(review(kinds.JOB, _job())).encode())


def test_past_the_connection_cap_a_connection_is_closed_unanswered(pair: ServingPair) -> None:
    """Idle connections cannot take every thread: with one slot held by a silent client, the
    next connection is closed at once (accepted in order: the silent one came first)."""
    running = WebhookServer(("127.0.0.1", 0), pair.cert, pair.key, max_connections=1)
    running.start()
    try:
        with (
            socket.create_connection(("127.0.0.1", running.port)),
            pytest.raises((ssl.SSLError, ConnectionError)),
        ):
            _connect(running, pair).request("GET", "/healthz")
    finally:
        running.stop()


def test_answers_leave_without_waiting_for_the_peers_ack(
    pair: ServingPair, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Headers and body are two writes: under Nagle's algorithm the body waited for the API
    server's delayed ACK on every answer (bench.webhook). The served socket has TCP_NODELAY."""
    seen: list[int] = []
    original = server._Handler.setup

    def setup(handler: Any) -> None:
        original(handler)
        seen.append(handler.connection.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY))

    monkeypatch.setattr(server._Handler, "setup", setup)
    running = WebhookServer(("127.0.0.1", 0), pair.cert, pair.key)
    running.start()
    try:
        assert (
            _post(_connect(running, pair), json.dumps(review(kinds.JOB, _job())).encode())[0] == 200
        )
    finally:
        running.stop()
    assert seen == [1]


def _install(source: ServingPair, folder: Path, *, key: bool = True) -> None:
    """Put `source`'s files in place as the kubelet swaps a Secret's: a new file renamed over."""
    for name, path in (("tls.crt", source.cert), ("tls.key", source.key))[: 2 if key else 1]:
        staged = folder / f".{name}.new"
        shutil.copyfile(path, staged)
        os.replace(staged, folder / name)


def _healthz(port: int, pair: ServingPair) -> int:
    conn = http.client.HTTPSConnection("127.0.0.1", port, context=pair.client_context(), timeout=30)
    OPEN.append(conn)
    conn.request("GET", "/healthz")
    return conn.getresponse().status


def test_a_renewed_certificate_is_served_without_a_restart(
    pair: ServingPair, tmp_path: Path
) -> None:
    mounted = tmp_path / "mounted"
    mounted.mkdir()
    _install(pair, mounted)
    running = WebhookServer(("127.0.0.1", 0), mounted / "tls.crt", mounted / "tls.key")
    running.start()
    try:
        assert _healthz(running.port, pair) == 200
        renewed = serving_pair(tmp_path / "renewed")
        _install(renewed, mounted)
        assert _healthz(running.port, renewed) == 200
        with pytest.raises(ssl.SSLCertVerificationError):
            _healthz(running.port, pair)
    finally:
        running.stop()


def test_a_half_swapped_pair_keeps_the_old_one(pair: ServingPair, tmp_path: Path) -> None:
    mounted = tmp_path / "mounted"
    mounted.mkdir()
    _install(pair, mounted)
    running = WebhookServer(("127.0.0.1", 0), mounted / "tls.crt", mounted / "tls.key")
    running.start()
    try:
        _install(serving_pair(tmp_path / "renewed"), mounted, key=False)  # the key not yet
        assert _healthz(running.port, pair) == 200
    finally:
        running.stop()
