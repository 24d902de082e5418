"""Webhooks that cannot reach inside, stall a worker or be forged (issue 34, item 1).

The receivers are real servers on 127.0.0.1, reached only with GANTRY_WEBHOOK_ALLOW_PRIVATE
on (as on an on-premises network); with it off, as in production, the same servers receive
nothing. Names are resolved by a fake resolver: the tests look nothing up. What an admin sees
is read through the API."""

from __future__ import annotations

import hashlib
import hmac
import socket
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from django.core.exceptions import ValidationError
from django.db import transaction

from common.management.commands import run_embedded
from config.celery import app as celery_app
from tenants import outbox, services, webhooks
from tenants import tasks as tenant_tasks
from tenants.models import AuditEntry, Notification, NotificationKind, NotificationState, Tenant
from tenants.outbox import Event, notifications_add, outbox_deliver
from tests.conftest import Org

pytestmark = pytest.mark.django_db

PUBLIC = "93.184.215.14"  # any global address: nothing connects to it (a fake transport)
NAMES = {
    "hooks.example.com": [PUBLIC],
    "rebind.example.com": ["10.1.2.3"],  # a public name that answers a private address
    "half.example.com": [PUBLIC, "169.254.169.254"],  # one of its addresses is inside
}


@pytest.fixture(autouse=True)
def names(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The resolver: NAMES, anything else unknown; returns the names looked up."""
    asked: list[str] = []

    def resolve(host: str, port: int) -> list[str]:
        asked.append(host)
        if host not in NAMES:
            raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")
        return NAMES[host]

    monkeypatch.setattr(webhooks, "resolver", resolve)
    return asked


class Receiver:
    """A server on 127.0.0.1 whose handler `answer(handler)` does what the test needs."""

    def __init__(self, answer: Callable[[BaseHTTPRequestHandler], None]) -> None:
        self.requests: list[tuple[dict[str, str], bytes]] = []
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length", 0))
                receiver.requests.append((dict(self.headers), self.rfile.read(length)))
                answer(self)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = HTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_port}/hook"
        self.thread = threading.Thread(
            target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join()


@pytest.fixture
def receivers() -> Iterator[Callable[..., Receiver]]:
    made: list[Receiver] = []

    def make(answer: Callable[[BaseHTTPRequestHandler], None] | None = None) -> Receiver:
        made.append(Receiver(answer or _ok))
        return made[-1]

    yield make
    for receiver in made:
        receiver.close()


def _ok(handler: BaseHTTPRequestHandler) -> None:
    handler.send_response(200)
    handler.end_headers()


def hooked(tenant: Tenant, url: str) -> None:
    """Point the webhook at a local http server (past the https validator), its secret kept."""
    Tenant.objects.filter(pk=tenant.pk).update(webhook_url=url)
    tenant.refresh_from_db()


def deliver_one(tenant: Tenant) -> Notification:
    with transaction.atomic():
        (row,) = notifications_add(
            [Event(tenant_id=tenant.pk, kind=NotificationKind.STARTED, text="job started")],
            kick=False,
        )
    outbox_deliver(now=row.next_attempt_at)
    row.refresh_from_db()
    return row


# --- refused where it is set -----------------------------------------------------------------

INSIDE = [
    "https://127.0.0.1/h",
    "https://127.1/h",  # loopback, short form
    "https://169.254.169.254/latest/meta-data/",  # the cloud's metadata address
    "https://10.0.0.5/h",
    "https://172.16.0.1/h",
    "https://192.168.1.1/h",
    "https://100.64.0.1/h",  # carrier-grade NAT
    "https://0.0.0.0/h",
    "https://224.0.0.1/h",  # multicast
    "https://[::1]/h",
    "https://[fd00::1]/h",  # unique local
    "https://[fe80::1]/h",  # link-local
    "https://[::ffff:127.0.0.1]/h",  # IPv4-mapped loopback
    "https://[64:ff9b::a9fe:a9fe]/h",  # the metadata address through NAT64
    "https://[ff02::1]/h",
    "https://localhost/h",
    "https://kubernetes.default.svc/api",
    "https://kubernetes.default.svc.cluster.local/api",
    "https://gantry-web/h",  # no dot: a search domain would make it a service
    "https://metadata.google.internal/h",
    "https://rebind.example.com/h",
    "https://half.example.com/h",
]


@pytest.mark.parametrize("url", INSIDE)
def test_a_webhook_inside_the_network_is_refused_when_set(org: Org, url: str) -> None:
    """Through the service that the API and the portal's form both call."""
    with pytest.raises(ValidationError) as refused:
        services.tenant_update(user=org.users["tina"], tenant=org.alpha, webhook_url=url)
    assert list(refused.value.message_dict) == ["webhook_url"]
    org.alpha.refresh_from_db()
    assert (org.alpha.webhook_url, org.alpha.webhook_secret) == ("", "")


@pytest.mark.parametrize(
    "url",
    ["https://kubernetes.default.svc/api", "https://rebind.example.com/h", "https://127.0.0.1/"],
)
def test_the_api_says_why_a_webhook_is_refused(org: Org, client_for: Any, url: str) -> None:
    response = client_for("tina").patch(
        f"/api/v1/tenants/{org.alpha.pk}/", {"webhook_url": url}, format="json"
    )
    assert response.status_code == 400, response.content
    assert response.json()["errors"]["webhook_url"]
    org.alpha.refresh_from_db()
    assert org.alpha.webhook_url == ""


def test_a_public_webhook_is_saved_and_its_secret_shown_once(org: Org, client_for: Any) -> None:
    url = f"/api/v1/tenants/{org.alpha.pk}/"
    tina = client_for("tina")
    made = tina.patch(url, {"webhook_url": "https://hooks.example.com/a"}, format="json")
    assert made.status_code == 200, made.content
    secret = made.json()["webhook_secret"]
    assert secret.startswith("whsec_") and len(secret) > 40
    # A new URL keeps the secret (its receiver verifies with it); a rename shows nothing.
    moved = tina.patch(url, {"webhook_url": "https://hooks.example.com/b"}, format="json")
    assert moved.json()["webhook_secret"] is None
    assert tina.patch(url, {"name": "Alpha"}, format="json").json()["webhook_secret"] is None
    org.alpha.refresh_from_db()
    assert org.alpha.webhook_secret == secret
    # No read shows it: the tenant, the list, the webhook's health, the audit log.
    for admin in ("tina", "dana", "pat", "carol"):
        client = client_for(admin)
        for path in (url, "/api/v1/tenants/", url + "webhook/", "/api/v1/audit/"):
            assert secret not in client.get(path).content.decode(), (admin, path)
    assert secret not in str(list(AuditEntry.objects.values_list("before", "after")))
    # Removing the webhook removes its secret; setting one again makes a new one.
    assert tina.patch(url, {"webhook_url": ""}, format="json").status_code == 200
    org.alpha.refresh_from_db()
    assert org.alpha.webhook_secret == ""
    again = tina.patch(url, {"webhook_url": "https://hooks.example.com/a"}, format="json")
    assert again.json()["webhook_secret"] not in ("", None, secret)


def test_a_name_that_does_not_resolve_yet_is_saved_and_checked_when_delivering(
    org: Org, client_for: Any, names: list[str]
) -> None:
    url = f"/api/v1/tenants/{org.alpha.pk}/"
    response = client_for("tina").patch(
        url, {"webhook_url": "https://later.example.org/h"}, format="json"
    )
    assert response.status_code == 200 and names == ["later.example.org"]
    row = deliver_one(org.alpha)
    assert (row.state, row.last_error) == (NotificationState.PENDING, outbox.FAILED_REASON)


def test_the_private_setting_lets_an_on_premises_receiver_be_set(
    org: Org, client_for: Any, settings: Any
) -> None:
    settings.GANTRY_WEBHOOK_ALLOW_PRIVATE = True
    response = client_for("tina").patch(
        f"/api/v1/tenants/{org.alpha.pk}/",
        {"webhook_url": "https://rebind.example.com/h"},  # answers 10.1.2.3
        format="json",
    )
    assert response.status_code == 200


# --- refused where it is delivered -----------------------------------------------------------


def test_a_receiver_inside_gets_nothing_when_delivered_to(
    org: Org, client_for: Any, receivers: Callable[..., Receiver]
) -> None:
    """A webhook saved before the checks (or whose name changed its answer since) is checked
    again at every delivery: the local server receives nothing."""
    receiver = receivers()
    hooked(org.alpha, receiver.url)
    row = deliver_one(org.alpha)
    assert receiver.requests == []
    assert (row.state, row.last_error) == (NotificationState.PENDING, outbox.REFUSED_REASON)
    health = client_for("tina").get(f"/api/v1/tenants/{org.alpha.pk}/webhook/").json()
    assert health["last_error"] == outbox.REFUSED_REASON


def test_the_connection_goes_to_the_address_checked_with_the_name_for_host_and_tls(
    org: Org, monkeypatch: pytest.MonkeyPatch, names: list[str]
) -> None:
    """DNS rebinding: the name answers a public address to the check, then 127.0.0.1; the
    request is sent to the address checked, once looked up, naming the host in its Host
    header and for TLS."""
    answers = iter([[PUBLIC], ["127.0.0.1"]])
    monkeypatch.setattr(webhooks, "resolver", lambda host, port: next(answers))
    seen: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(204, stream=_Stream(_nothing()))

    monkeypatch.setattr(webhooks, "transport_factory", lambda: httpx.MockTransport(handler))
    hooked(org.alpha, "https://hooks.example.com:8443/services/x?y=1")
    row = deliver_one(org.alpha)
    assert row.state == NotificationState.SENT
    (request,) = seen
    assert str(request.url) == f"https://{PUBLIC}:8443/services/x?y=1"
    assert request.headers["Host"] == "hooks.example.com:8443"
    assert request.extensions["sni_hostname"] == "hooks.example.com"


# --- no redirect, one deadline, a bounded read, one reason -----------------------------------


def _redirect_to(target: str) -> Callable[[BaseHTTPRequestHandler], None]:
    def answer(handler: BaseHTTPRequestHandler) -> None:
        handler.send_response(302)
        handler.send_header("Location", target)
        handler.end_headers()

    return answer


def _trickle(handler: BaseHTTPRequestHandler) -> None:
    """Starts an answer and sends one more byte every 50 ms, for 5 s at most."""
    handler.wfile.write(b"HTTP/1.1 200 OK\r\n")
    for _ in range(100):
        try:
            handler.wfile.write(b"X")
            handler.wfile.flush()
        except OSError:
            return
        time.sleep(0.05)  # the server's pace, not the test's: the delivery's deadline ends it


def _error(handler: BaseHTTPRequestHandler) -> None:
    handler.send_response(500)
    handler.end_headers()


def test_a_redirect_is_not_followed(
    org: Org, settings: Any, receivers: Callable[..., Receiver]
) -> None:
    settings.GANTRY_WEBHOOK_ALLOW_PRIVATE = True
    inside = receivers()
    hooked(org.alpha, receivers(_redirect_to(inside.url + "/admin")).url)
    row = deliver_one(org.alpha)
    assert inside.requests == []
    assert (row.state, row.last_error) == (NotificationState.PENDING, outbox.FAILED_REASON)


def test_a_trickling_receiver_is_cut_off_at_the_deadline(
    org: Org, settings: Any, receivers: Callable[..., Receiver]
) -> None:
    """The deadline is the whole delivery's, not one socket read's: a byte every 50 ms would
    keep a per-read timeout of 0.3 s waiting for 5 s."""
    settings.GANTRY_WEBHOOK_ALLOW_PRIVATE = True
    settings.GANTRY_NOTIFY_TIMEOUT_S = 0.3
    hooked(org.alpha, receivers(_trickle).url)
    started = time.monotonic()
    row = deliver_one(org.alpha)
    assert time.monotonic() - started < 1.5
    assert (row.state, row.last_error) == (NotificationState.PENDING, outbox.FAILED_REASON)


def test_a_lookup_that_hangs_is_cut_off_at_the_deadline(
    org: Org, settings: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    settings.GANTRY_NOTIFY_TIMEOUT_S = 0.3
    release = threading.Event()

    def hang(host: str, port: int) -> list[str]:
        release.wait(5)
        return [PUBLIC]

    monkeypatch.setattr(webhooks, "resolver", hang)
    hooked(org.alpha, "https://hooks.example.com/h")
    started = time.monotonic()
    try:
        row = deliver_one(org.alpha)
    finally:
        release.set()
    assert time.monotonic() - started < 1.5
    assert row.last_error == outbox.FAILED_REASON


def test_at_most_the_read_limit_of_an_answer_is_read(
    org: Org, monkeypatch: pytest.MonkeyPatch
) -> None:
    pulled: list[int] = []

    async def endless() -> AsyncIterator[bytes]:
        while True:
            pulled.append(16 * 1024)
            yield b"x" * 16 * 1024

    response = httpx.Response(200, stream=_Stream(endless()))
    transport = httpx.MockTransport(lambda request: response)
    monkeypatch.setattr(webhooks, "transport_factory", lambda: transport)
    hooked(org.alpha, "https://hooks.example.com/h")
    assert deliver_one(org.alpha).state == NotificationState.SENT
    assert sum(pulled) == webhooks.READ_LIMIT


async def _nothing() -> AsyncIterator[bytes]:
    for chunk in ():
        yield chunk


class _Stream(httpx.AsyncByteStream):
    """An answer's body as a real transport gives it: streamed, not loaded."""

    def __init__(self, chunks: AsyncIterator[bytes]) -> None:
        self.chunks = chunks

    async def __aiter__(self) -> AsyncIterator[bytes]:
        async for chunk in self.chunks:
            yield chunk


def test_every_failure_reads_the_same_to_the_admins(
    org: Org, client_for: Any, settings: Any, receivers: Callable[..., Receiver]
) -> None:
    """Closed port, TLS spoken to plain HTTP, no answer in time, an error status: one reason
    (a port scanner learns nothing from the health)."""
    settings.GANTRY_WEBHOOK_ALLOW_PRIVATE = True
    settings.GANTRY_NOTIFY_TIMEOUT_S = 0.3
    closed = socket.socket()
    closed.bind(("127.0.0.1", 0))
    port = closed.getsockname()[1]
    closed.close()
    plain = receivers().url.replace("http://", "https://")
    urls = [f"http://127.0.0.1:{port}/h", plain, receivers(_trickle).url, receivers(_error).url]
    shown = set()
    for url in urls:
        hooked(org.alpha, url)
        assert deliver_one(org.alpha).state == NotificationState.PENDING
        health = client_for("tina").get(f"/api/v1/tenants/{org.alpha.pk}/webhook/").json()
        shown.add(health["last_error"])
    assert shown == {outbox.FAILED_REASON}


# --- signed -----------------------------------------------------------------------------------


def verify(secret: str, header: str, body: bytes, now: float, tolerance_s: int = 300) -> bool:
    """The receiver's check, as docs/notifications.md shows it."""
    fields = dict(part.split("=", 1) for part in header.split(","))
    timestamp = int(fields["t"])
    expected = hmac.new(secret.encode(), f"{timestamp}.".encode() + body, hashlib.sha256)
    fresh = abs(now - timestamp) <= tolerance_s
    return fresh and hmac.compare_digest(expected.hexdigest(), fields["v1"])


def test_a_post_is_signed_with_the_secret_shown_once_and_a_rotation_replaces_it(
    org: Org, client_for: Any, settings: Any, receivers: Callable[..., Receiver]
) -> None:
    tina = client_for("tina")
    url = f"/api/v1/tenants/{org.alpha.pk}/"
    made = tina.patch(url, {"webhook_url": "https://hooks.example.com/a"}, format="json")
    secret = made.json()["webhook_secret"]
    settings.GANTRY_WEBHOOK_ALLOW_PRIVATE = True
    receiver = receivers()
    hooked(org.alpha, receiver.url)
    row = deliver_one(org.alpha)
    assert row.state == NotificationState.SENT
    headers, body = receiver.requests[0]
    signed_at = row.sent_at.timestamp()
    assert headers["X-Gantry-Event"] == "started"
    assert verify(secret, headers["X-Gantry-Signature"], body, now=signed_at)
    assert not verify(secret, headers["X-Gantry-Signature"], body + b" ", now=signed_at)
    assert not verify(secret, headers["X-Gantry-Signature"], body, now=signed_at + 301)

    assert client_for("alice").post(url + "webhook/secret/").status_code == 403
    assert client_for("bob-bravo").post(url + "webhook/secret/").status_code == 404
    rotated = tina.post(url + "webhook/secret/")
    assert rotated.status_code == 200, rotated.content
    new = rotated.json()["secret"]
    assert new != secret
    deliver_one(org.alpha)
    headers, body = receiver.requests[1]
    assert verify(new, headers["X-Gantry-Signature"], body, now=time.time())
    assert not verify(secret, headers["X-Gantry-Signature"], body, now=time.time())
    assert new not in tina.get(url).content.decode()
    assert AuditEntry.objects.filter(action="tenant.webhook_secret_rotate").count() == 1


# --- one message per task, on a queue of its own ----------------------------------------------


def test_the_sweep_queues_one_task_per_message_and_a_duplicate_sends_nothing(
    org: Org, monkeypatch: pytest.MonkeyPatch
) -> None:
    posts: list[str] = []
    monkeypatch.setattr(outbox, "webhook_transport", lambda url, body, headers: posts.append(url))
    hooked(org.alpha, "https://hooks.example.com/h")
    with transaction.atomic():
        rows = notifications_add(
            [Event(org.alpha.pk, NotificationKind.FAILED, f"job {i}") for i in range(3)],
            kick=False,
        )
    queued: list[tuple[int, int]] = []
    monkeypatch.setattr(tenant_tasks.notification_send, "delay", lambda *a: queued.append(a))
    tenant_tasks.notifications_deliver()
    assert sorted(queued) == [(row.pk, 1) for row in rows]
    tenant_tasks.notifications_deliver()  # claimed: not queued again
    assert len(queued) == 3 and posts == []
    assert tenant_tasks.notification_send(rows[0].pk, 1) == "sent"
    assert tenant_tasks.notification_send(rows[0].pk, 1) is None  # delivered twice: sent once
    assert len(posts) == 1
    route = celery_app.amqp.router.route({}, tenant_tasks.notification_send.name)
    assert route["queue"].name == "notifications"
    task = tenant_tasks.notification_send
    assert task.soft_time_limit is not None and task.time_limit > task.soft_time_limit


def test_every_worker_consumes_every_queue() -> None:
    """The embedded default's worker and the Kubernetes worker name every queue that tasks
    are routed to: a queue nobody consumes would keep its messages forever."""
    from django.conf import settings

    queues = ",".join(settings.GANTRY_CELERY_QUEUES)
    routed = {route["queue"] for route in settings.CELERY_TASK_ROUTES.values()}
    assert routed <= set(settings.GANTRY_CELERY_QUEUES)
    embedded = run_embedded.commands("127.0.0.1", 8000, "/tmp")["worker"]
    assert f"--queues={queues}" in embedded
    manifest = Path(settings.BASE_DIR, "platform/k8s/22-worker.yaml").read_text()
    (worker,) = yaml.safe_load(manifest)["spec"]["template"]["spec"]["containers"]
    assert worker["command"][worker["command"].index("--queues") + 1] == queues
