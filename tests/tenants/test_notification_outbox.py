"""The notification outbox (issue 20): delivery with backoff against a real local HTTP server,
the bound on undelivered rows, the webhook's owner up the tree, the health its admins see, and
no HTTP inside a request. Time is the delivery's `now`: nothing waits on the wall clock."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from datetime import timedelta
from http.server import BaseHTTPRequestHandler, HTTPServer
from typing import Any

import pytest
from django.core import mail
from django.db import transaction

from tenants import outbox
from tenants import tasks as tenant_tasks
from tenants.models import (
    AuditEntry,
    Notification,
    NotificationChannel,
    NotificationKind,
    NotificationState,
    Tenant,
)
from tenants.outbox import Event, backoff, notifications_add, outbox_deliver, webhook_health
from tests.conftest import Org

pytestmark = pytest.mark.django_db


class Hook:
    """A webhook on 127.0.0.1 that answers 500 to its first `failures` posts, then 200."""

    def __init__(self, failures: int) -> None:
        self.failures = failures
        self.bodies: list[dict[str, Any]] = []
        hook = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                length = int(self.headers["Content-Length"])
                hook.bodies.append(json.loads(self.rfile.read(length)))
                self.send_response(500 if len(hook.bodies) <= hook.failures else 200)
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = HTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_port}/services/T1/B2/secret-token"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join()


@pytest.fixture
def hook(settings: Any) -> Iterator[Hook]:
    settings.GANTRY_WEBHOOK_ALLOW_PRIVATE = True  # the receiver is on 127.0.0.1
    made = Hook(failures=2)
    yield made
    made.close()


def hooked(tenant: Tenant, url: str) -> None:
    """Set the webhook past the model's https validator: the local test server speaks http
    (the validator itself is tested through the API below)."""
    Tenant.objects.filter(pk=tenant.pk).update(webhook_url=url)
    tenant.refresh_from_db()


def add(tenant: Tenant, text: str = "hello", **kw: Any) -> list[Notification]:
    with transaction.atomic():
        return notifications_add(
            [Event(tenant_id=tenant.pk, kind=NotificationKind.STARTED, text=text, **kw)],
            kick=False,
        )


def test_the_webhook_is_retried_with_backoff_until_the_local_server_accepts(
    org: Org, hook: Hook
) -> None:
    hooked(org.alpha, hook.url)
    (row,) = add(org.alpha, "job started", fields={"job": 7})
    t0 = row.next_attempt_at
    first = outbox_deliver(now=t0)
    assert (first.sent, first.retrying, first.failed, first.dropped) == (0, 1, 0, 0)
    row.refresh_from_db()
    assert (row.state, row.attempts) == (NotificationState.PENDING, 1)
    # The reason shown is generic (the log has the status): no port scanner in the health.
    assert row.last_error == outbox.FAILED_REASON and row.next_attempt_at == t0 + backoff(1)
    outbox_deliver(now=t0 + backoff(1) - timedelta(seconds=1))  # not due yet
    assert len(hook.bodies) == 1
    t1 = t0 + backoff(1)
    outbox_deliver(now=t1)  # the second failure doubles the wait
    row.refresh_from_db()
    assert row.attempts == 2 and row.next_attempt_at == t1 + backoff(2)
    assert backoff(2) == 2 * backoff(1)
    assert vars(outbox_deliver(now=t1 + backoff(2)))["sent"] == 1
    row.refresh_from_db()
    assert (row.state, row.attempts, row.sent_at) == (NotificationState.SENT, 3, t1 + backoff(2))
    assert len(hook.bodies) == 3
    assert hook.bodies[-1] == {"text": "job started", "gantry": {"event": "started", "job": 7}}
    outbox_deliver(now=t1 + backoff(2) * 10)  # sent once
    assert len(hook.bodies) == 3
    health = webhook_health(org.alpha)
    assert (health.last_success_at, health.undelivered, health.dropped) == (row.sent_at, 0, 0)
    assert health.last_failure_at == t1 and health.last_error == outbox.FAILED_REASON


def test_a_webhook_that_never_answers_is_given_up_after_the_most_attempts(
    org: Org, settings: Any
) -> None:
    settings.GANTRY_NOTIFY_MAX_ATTEMPTS = 3
    settings.GANTRY_WEBHOOK_ALLOW_PRIVATE = True
    hooked(org.alpha, "http://127.0.0.1:9/closed")  # the discard port: connection refused
    (row,) = add(org.alpha)
    at = row.next_attempt_at
    for attempt in (1, 2, 3):
        outbox_deliver(now=at)
        at += backoff(attempt)
    row.refresh_from_db()
    assert (row.state, row.attempts) == (NotificationState.FAILED, 3)
    assert webhook_health(org.alpha).failed == 1


def test_the_bound_drops_the_oldest_undelivered_and_counts_them(
    org: Org, settings: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    settings.GANTRY_NOTIFY_MAX_PENDING = 3
    hooked(org.alpha, "https://hooks.example.com/services/x")
    monkeypatch.setattr(outbox, "webhook_transport", _refuse)
    rows = [add(org.alpha, f"event {i}")[0] for i in range(5)]
    result = outbox_deliver(now=rows[-1].next_attempt_at)
    assert result.dropped == 2 and result.retrying == 3
    states = dict(Notification.objects.values_list("payload__text", "state"))
    assert states == {
        "event 0": NotificationState.DROPPED,
        "event 1": NotificationState.DROPPED,
        "event 2": NotificationState.PENDING,
        "event 3": NotificationState.PENDING,
        "event 4": NotificationState.PENDING,
    }
    health = webhook_health(org.alpha)
    assert (health.undelivered, health.dropped) == (3, 2)
    add(org.alpha, "event 5")
    assert outbox_deliver(now=rows[-1].next_attempt_at).dropped == 1  # still 3 waiting
    assert webhook_health(org.alpha).undelivered == 3


def _refuse(url: str, body: bytes, headers: Any = None) -> None:
    raise OSError("connection refused")


def test_the_webhook_of_the_nearest_tenant_up_the_tree_receives_and_email_goes_beside(
    org: Org, monkeypatch: pytest.MonkeyPatch
) -> None:
    hooked(org.research, "https://hooks.example.com/services/research")
    posts: list[tuple[str, Any]] = []
    monkeypatch.setattr(
        outbox, "webhook_transport", lambda u, b, h: posts.append((u, json.loads(b)))
    )
    with transaction.atomic():
        notifications_add(
            [
                Event(org.alpha.pk, NotificationKind.FAILED, "alpha failed", emails=("a@x.io",)),
                Event(org.charlie.pk, NotificationKind.FAILED, "charlie failed"),  # no webhook
            ],
            kick=False,
        )
    rows = Notification.objects.order_by("channel")
    assert [(r.tenant_id, r.channel) for r in rows] == [
        (org.alpha.pk, NotificationChannel.EMAIL),
        (org.research.pk, NotificationChannel.WEBHOOK),
    ]
    outbox_deliver(now=rows[0].next_attempt_at)
    assert posts == [
        (
            "https://hooks.example.com/services/research",
            {"text": "alpha failed", "gantry": {"event": "failed"}},
        )
    ]
    assert [(m.to, m.body) for m in mail.outbox] == [(["a@x.io"], "alpha failed\n")]


# --- the API: health, test send, no HTTP in a request ---------------------------------------


def test_health_and_test_send_are_the_tenants_admins_alone(
    org: Org, client_for: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    hooked(org.alpha, "https://hooks.example.com/services/T1/B2/secret-token")
    url = f"/api/v1/tenants/{org.alpha.pk}/webhook/"
    assert client_for("alice").get(url).status_code == 403  # a member of the team
    assert client_for("alice").post(url + "test/").status_code == 403
    assert client_for("bob-bravo").get(url).status_code == 404  # another team
    assert client_for("bob-bravo").post(url + "test/").status_code == 404
    assert client_for("chris").get(url).status_code == 404
    assert Notification.objects.count() == 0
    for admin in ("tina", "dana", "pat"):  # the team's, the department's, the platform's
        body = client_for(admin).get(url).json()
        assert body["url"] == "https://hooks.example.com/services/T1/B2/secret-token"
        assert body["undelivered"] == 0
    # Finance reads everything but changes nothing: the health, with the URL's host only.
    assert client_for("carol").get(url).json()["url"] == "https://hooks.example.com/…"
    assert client_for("carol").post(url + "test/").status_code == 403


def test_a_request_never_waits_on_the_webhook(
    org: Org,
    client_for: Any,
    monkeypatch: pytest.MonkeyPatch,
    django_capture_on_commit_callbacks: Any,
) -> None:
    """The sender raises if anything calls it inside the request: the request only writes
    the outbox and queues a delivery (here recorded instead of a broker)."""
    hooked(org.alpha, "https://hooks.example.com/services/slow")

    def slow(url: str, body: bytes, headers: Any = None) -> None:
        raise AssertionError("the webhook was called inside the request")

    kicked: list[bool] = []
    monkeypatch.setattr(outbox, "webhook_transport", slow)
    monkeypatch.setattr(tenant_tasks.notifications_deliver, "delay", lambda: kicked.append(True))
    with django_capture_on_commit_callbacks(execute=True):
        response = client_for("tina").post(f"/api/v1/tenants/{org.alpha.pk}/webhook/test/")
    assert response.status_code == 202, response.content
    row = Notification.objects.get(pk=response.json()["notification"])
    assert (row.kind, row.state, row.attempts) == ("test", NotificationState.PENDING, 0)
    assert kicked == [True]
    assert (
        client_for("tina").get(f"/api/v1/tenants/{org.alpha.pk}/webhook/").json()["undelivered"]
        == 1
    )


def test_test_send_without_a_webhook_is_a_400(org: Org, client_for: Any) -> None:
    response = client_for("tina").post(f"/api/v1/tenants/{org.alpha.pk}/webhook/test/")
    assert response.status_code == 400
    assert "webhook_url" in response.json()["errors"]
    assert Notification.objects.count() == 0


def test_the_audit_log_keeps_the_webhooks_host_not_its_secret(org: Org, client_for: Any) -> None:
    secret = "https://hooks.slack.com/services/T000/B000/XXXXsecretXXXX"
    response = client_for("tina").patch(
        f"/api/v1/tenants/{org.alpha.pk}/", {"webhook_url": secret}, format="json"
    )
    assert response.status_code == 200
    entry = AuditEntry.objects.get(action="tenant.update")
    assert entry.after["webhook_url"] == "https://hooks.slack.com/…"
    assert "XXXXsecretXXXX" not in json.dumps([entry.before, entry.after])
    listed = client_for("dana").get("/api/v1/audit/").content.decode()
    assert "XXXXsecretXXXX" not in listed


def test_settled_rows_are_purged_after_the_retention_but_waiting_ones_are_kept(
    org: Org, settings: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    settings.GANTRY_NOTIFY_RETENTION_DAYS = 30
    hooked(org.alpha, "https://hooks.example.com/services/x")
    sent, waiting = add(org.alpha, "sent")[0], add(org.alpha, "waiting")[0]
    Notification.objects.filter(pk=sent.pk).update(state=NotificationState.SENT)
    monkeypatch.setattr(outbox, "webhook_transport", _refuse)
    later = sent.created_at + timedelta(days=30)
    assert outbox_deliver(now=later).purged == 0  # not older than 30 days yet
    assert outbox_deliver(now=later + timedelta(seconds=1)).purged == 1
    assert list(Notification.objects.values_list("pk", flat=True)) == [waiting.pk]


def test_a_second_delivery_while_one_is_sending_does_not_send_the_row_again(
    org: Org, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Forces the interleaving: the transport of the first delivery runs a second one."""
    hooked(org.alpha, "https://hooks.example.com/services/x")
    (row,) = add(org.alpha, "once")
    posts: list[str] = []
    inner: list[Any] = []

    def post(url: str, body: bytes, headers: Any = None) -> None:
        posts.append(url)
        if not inner:
            inner.append(outbox_deliver(now=row.next_attempt_at))

    monkeypatch.setattr(outbox, "webhook_transport", post)
    assert outbox_deliver(now=row.next_attempt_at).sent == 1
    assert len(posts) == 1 and inner[0].sent == 0
    row.refresh_from_db()
    assert (row.state, row.attempts) == (NotificationState.SENT, 1)
