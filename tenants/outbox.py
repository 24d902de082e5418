"""The notification outbox: webhooks and emails for job, approval, idle and budget events.

Writers call `notifications_add` inside the transaction of the change they report: a few
cheap inserts, never a network call, so a request or a scheduling cycle never waits on a
webhook. Delivery is two steps (Celery: `notifications_deliver`, a task kicked on commit and
the beat sweep, then one `notification_send` task per message on the `notifications` queue):

1. `outbox_claim` trims and purges, then claims every row due (at most `limit`): a
   compare-and-swap on its attempt count that also moves its next attempt to where a failure
   would put it (`GANTRY_NOTIFY_BACKOFF_S * 2**(attempts-1)`, capped at
   `GANTRY_NOTIFY_BACKOFF_MAX_S`), so the next sweep does not claim it again;
2. `notification_send` sends one claimed row outside any transaction and records the outcome:
   a success marks it sent; a failure keeps a reason and, after `GANTRY_NOTIFY_MAX_ATTEMPTS`,
   fails the row. One slow receiver thus holds one task for at most its deadline
   (tenants/webhooks.py), never the messages of other tenants behind it.

An unreachable webhook therefore costs one attempt per row per backoff step, and at most
`GANTRY_NOTIFY_MAX_PENDING` rows per tenant and channel wait: older ones are dropped
(counted, shown to the tenant's admins) by `outbox_trim`.

A webhook row belongs to the nearest tenant up the tree that has a `webhook_url`: a team
without one reports to its department's. The URL and the signing secret are read when
delivering, so a corrected URL serves the rows still waiting.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from django.conf import settings
from django.core.mail import send_mail
from django.db import transaction
from django.db.models import Count, Max
from django.utils import timezone

from tenants import webhooks
from tenants.models import (
    ApprovalRequest,
    ApprovalState,
    Notification,
    NotificationChannel,
    NotificationKind,
    NotificationState,
    Tenant,
)

log = logging.getLogger("gantry.notifications")

# (url, JSON body, headers) -> None; raises DeliveryFailed, WebhookRefused or OSError when
# the post failed. Tests replace it.
Transport = Callable[[str, bytes, Mapping[str, str]], None]
webhook_transport: Transport = webhooks.post

# What the tenant's admins read of a failed webhook delivery, whatever failed: a refused
# connection, a TLS error, a timeout and an error status read the same, so that the webhook
# tells nothing about what listens where (the detail is in the worker's log).
FAILED_REASON = "delivery failed: the receiver did not answer with 2xx in time"
REFUSED_REASON = "delivery refused: the webhook's host is not a public address"


@dataclass(frozen=True)
class Event:
    """Something to tell: `tenant_id` is the tenant it happened in (its webhook, or the nearest
    one up the tree, receives it); `emails` are addresses that also get it by email."""

    tenant_id: int
    kind: str
    text: str
    subject: str = ""
    fields: dict[str, Any] = field(default_factory=dict)
    emails: tuple[str, ...] = ()


def webhook_owners(tenant_ids: Iterable[int]) -> dict[int, int]:
    """tenant -> the nearest tenant up the tree (itself included) with a webhook; tenants
    with none above them are left out. Two queries."""
    paths = dict(Tenant.objects.filter(id__in=set(tenant_ids)).values_list("id", "path"))
    chains = {t: [int(p) for p in path.strip("/").split("/") if p] for t, path in paths.items()}
    wanted = {a for chain in chains.values() for a in chain}
    hooked = set(
        Tenant.objects.filter(id__in=wanted).exclude(webhook_url="").values_list("id", flat=True)
    )
    owners = {}
    for tenant, chain in chains.items():
        owner = next((a for a in reversed(chain) if a in hooked), None)
        if owner is not None:
            owners[tenant] = owner
    return owners


def notifications_add(
    events: Sequence[Event], *, kick: bool = True, owners: Mapping[int, int] | None = None
) -> list[Notification]:
    """Write `events` to the outbox in the caller's transaction (bulk inserts, no network).
    `kick` queues a delivery once committed; the daemon passes False (its cycle must not
    talk to the broker) and the beat sweep delivers its rows. `owners`: the events' tenants'
    `webhook_owners`, when the caller has them. Returns the rows written."""
    if not events:
        return []
    now = timezone.now()
    if owners is None:
        owners = webhook_owners(e.tenant_id for e in events)
    rows = []
    for event in events:
        payload = {"text": event.text, "gantry": {"event": event.kind, **event.fields}}
        base: dict[str, Any] = {
            "kind": event.kind,
            "payload": payload,
            "subject": event.subject[:200],
        }
        base |= {"created_at": now, "next_attempt_at": now}
        if event.tenant_id in owners:
            rows.append(
                Notification(
                    tenant_id=owners[event.tenant_id], channel=NotificationChannel.WEBHOOK, **base
                )
            )
        for address in sorted(set(event.emails)):
            rows.append(
                Notification(
                    tenant_id=event.tenant_id,
                    channel=NotificationChannel.EMAIL,
                    recipient=address,
                    **base,
                )
            )
    made = Notification.objects.bulk_create(rows)
    if made and kick:
        transaction.on_commit(kick_delivery)
    return made


def kick_delivery() -> None:
    """Queue a delivery now; a broker that is down is no failure (the sweep delivers)."""
    from tenants.tasks import notifications_deliver  # tasks import this module

    try:
        notifications_deliver.delay()
    except Exception:  # any broker error
        log.warning("could not queue a notification delivery", exc_info=True)


def backoff(attempts: int) -> timedelta:
    """The wait after the `attempts`-th failed attempt."""
    base = settings.GANTRY_NOTIFY_BACKOFF_S * 2 ** max(attempts - 1, 0)
    return timedelta(seconds=min(base, settings.GANTRY_NOTIFY_BACKOFF_MAX_S))


def outbox_trim() -> int:
    """Drop the oldest pending rows of each tenant and channel beyond
    GANTRY_NOTIFY_MAX_PENDING. Returns how many were dropped."""
    keep = settings.GANTRY_NOTIFY_MAX_PENDING
    pending = Notification.objects.filter(state=NotificationState.PENDING)
    over = (
        pending.values("tenant_id", "channel")
        .annotate(n=Count("id"))
        .filter(n__gt=keep)
        .values_list("tenant_id", "channel")
    )
    dropped = 0
    for tenant_id, channel in list(over):
        mine = pending.filter(tenant_id=tenant_id, channel=channel)
        newest = mine.order_by("-id").values_list("id", flat=True)[keep - 1 : keep]
        cut = list(newest)
        if not cut:
            continue
        dropped += mine.filter(id__lt=cut[0]).update(
            state=NotificationState.DROPPED,
            last_error=f"dropped: more than {keep} notifications waited",
        )
    return dropped


def outbox_purge(*, now: datetime) -> int:
    """Delete the rows settled (sent, failed, dropped) more than GANTRY_NOTIFY_RETENTION_DAYS
    ago, so the outbox holds what is waiting and a window of history for the health."""
    cutoff = now - timedelta(days=settings.GANTRY_NOTIFY_RETENTION_DAYS)
    settled = Notification.objects.exclude(state=NotificationState.PENDING)
    deleted, _ = settled.filter(created_at__lt=cutoff).delete()
    return deleted


@dataclass
class Delivery:
    sent: int = 0
    retrying: int = 0
    failed: int = 0
    dropped: int = 0
    purged: int = 0


def outbox_claim(*, now: datetime, limit: int = 500) -> tuple[Delivery, list[tuple[int, int]]]:
    """Trim and purge, then claim the rows due at `now` (at most `limit`): (row, attempt)
    pairs for `notification_send`. Safe to run twice at once: a row is claimed by one."""
    result = Delivery(dropped=outbox_trim(), purged=outbox_purge(now=now))
    due = Notification.objects.filter(
        state=NotificationState.PENDING, next_attempt_at__lte=now
    ).order_by("next_attempt_at", "id")
    rows = list(due.values_list("id", "attempts")[:limit])
    claimed = []
    for row_id, attempts in rows:
        # The claim moves the next attempt to where a failure would put it: a second sweep
        # finds it not due, no transaction stays open across the network call (SQLite's
        # writers, PostgreSQL's locks), and a task lost or killed while sending leaves it
        # due again later (at least once).
        mine = Notification.objects.filter(
            pk=row_id, state=NotificationState.PENDING, attempts=attempts
        )
        attempt = attempts + 1
        if mine.update(
            attempts=attempt, last_attempt_at=now, next_attempt_at=now + backoff(attempt)
        ):
            claimed.append((row_id, attempt))
    return result, claimed


def outbox_deliver(*, now: datetime, limit: int = 500) -> Delivery:
    """Claim what is due and send it here, one row after another: for tests and tools. The
    worker sends each claimed row in its own task (tenants.tasks.notifications_deliver)."""
    result, claimed = outbox_claim(now=now, limit=limit)
    for row_id, attempt in claimed:
        outcome = notification_send(row_id, attempt, now=now)
        if outcome is not None:
            setattr(result, outcome, getattr(result, outcome) + 1)
    return result


def notification_send(row_id: int, attempt: int, *, now: datetime) -> str | None:
    """Send one claimed row and record the outcome: "sent", "retrying" or "failed", or
    "dropped" for an email that is no longer worth sending (`_stale`); None when the row is
    no longer this claim's (sent, or claimed again after a lost message)."""
    row = (
        Notification.objects.select_related("tenant")
        .filter(pk=row_id, state=NotificationState.PENDING, attempts=attempt)
        .first()
    )
    if row is None:
        return None
    mine = Notification.objects.filter(pk=row_id, state=NotificationState.PENDING, attempts=attempt)
    stale = _stale(row)
    if stale:
        mine.update(state=NotificationState.DROPPED, last_error=stale)
        return "dropped"
    try:
        _send(row, now)
    except (webhooks.DeliveryFailed, webhooks.WebhookRefused, OSError, ValueError) as error:
        given_up = attempt >= settings.GANTRY_NOTIFY_MAX_ATTEMPTS
        failure: dict[str, Any] = {"last_error": _reason(row, error), "last_error_at": now}
        if given_up:
            failure["state"] = NotificationState.FAILED
        mine.update(**failure)
        return "failed" if given_up else "retrying"
    mine.update(state=NotificationState.SENT, sent_at=now)
    return "sent"


def _stale(row: Notification) -> str:
    """Why an email is no longer worth sending ("" while it is): an "approval needed" email
    whose request was decided, withdrawn or expired before it went out (the outbox sends a
    second or more after the request, and a decider may be quicker) would ask its reader to
    decide what is settled. A webhook gets every event in order, as an integration's log."""
    if row.channel != NotificationChannel.EMAIL or row.kind != NotificationKind.APPROVAL_NEEDED:
        return ""
    request_id = row.payload.get("gantry", {}).get("request")
    state = ApprovalRequest.objects.filter(pk=request_id).values_list("state", flat=True).first()
    if state is None or state == ApprovalState.PENDING:
        return ""
    return f"not sent: the request was {state} before this email went out"


def _reason(row: Notification, error: Exception) -> str:
    """What is kept (and shown) of a failure; the detail of a webhook's goes to the log."""
    if row.channel == NotificationChannel.EMAIL:
        return f"{type(error).__name__}: {error}"[:500]
    log.warning(
        "webhook delivery %s of tenant %s failed: %s: %s",
        row.pk,
        row.tenant_id,
        type(error).__name__,
        error,
    )
    if isinstance(error, webhooks.WebhookRefused):
        return REFUSED_REASON
    if isinstance(error, ValueError):  # no webhook any more: nothing to hide
        return str(error)[:500]
    return FAILED_REASON


def _send(row: Notification, now: datetime) -> None:
    if row.channel == NotificationChannel.EMAIL:
        subject = row.subject or f"[Gantry] {row.kind}"
        send_mail(subject, row.payload["text"] + "\n", None, [row.recipient])
        return
    url = row.tenant.webhook_url
    if not url:
        raise ValueError("the tenant has no webhook any more")
    body = json.dumps(row.payload).encode()
    headers = {
        webhooks.SIGNATURE_HEADER: webhooks.signature(
            row.tenant.webhook_secret, int(now.timestamp()), body
        ),
        "X-Gantry-Event": row.kind,
        "X-Gantry-Delivery": str(row.pk),
    }
    webhook_transport(url, body, headers)


# --- what the tenant's admins see ---------------------------------------------------------


def redact_url(url: str) -> str:
    """The URL without its path, query and credentials: incoming-webhook URLs carry their
    secret in the path (Slack's /services/T../B../<token>), so what is shown and audited is
    the scheme and host."""
    if not url:
        return ""
    parts = urlsplit(url)
    host = parts.hostname or ""
    if parts.port:
        host = f"{host}:{parts.port}"
    return urlunsplit((parts.scheme, host, "/…" if parts.path not in ("", "/") else "", "", ""))


@dataclass(frozen=True)
class WebhookHealth:
    url: str
    last_success_at: datetime | None
    last_failure_at: datetime | None
    last_error: str
    undelivered: int
    failed: int
    dropped: int


def webhook_health(tenant: Tenant) -> WebhookHealth:
    """The tenant's webhook as its admins see it: the last success, the last failed attempt
    and its error, and the rows waiting, given up and dropped."""
    rows = Notification.objects.filter(tenant=tenant, channel=NotificationChannel.WEBHOOK)
    counts = dict(rows.values_list("state").annotate(n=Count("id")).values_list("state", "n"))
    last_sent = rows.aggregate(at=Max("sent_at"))["at"]
    failure = rows.filter(last_error_at__isnull=False).order_by("-last_error_at", "-id").first()
    return WebhookHealth(
        url=tenant.webhook_url,
        last_success_at=last_sent,
        last_failure_at=failure.last_error_at if failure else None,
        last_error=failure.last_error if failure else "",
        undelivered=counts.get(NotificationState.PENDING, 0),
        failed=counts.get(NotificationState.FAILED, 0),
        dropped=counts.get(NotificationState.DROPPED, 0),
    )


def webhook_test_event(tenant: Tenant, actor_name: str) -> Event:
    text = f"Test notification for '{tenant.slug}' from Gantry, sent by {actor_name}."
    return Event(tenant_id=tenant.pk, kind=NotificationKind.TEST, text=text)
