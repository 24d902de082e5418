"""Approval-needed and idle events in the notification outbox (issue 20): exactly one webhook
row each, written with the change (the job events of the daemon are in
tests/daemon/test_job_notifications.py, budget alerts in tests/billing/test_budgets.py)."""

from __future__ import annotations

from typing import Any
from unittest.mock import patch

import pytest
from django.core import mail
from django.utils import timezone

from scheduler.jobs.services import job_submit
from tenants import outbox
from tenants.approvals import approval_decide
from tenants.models import (
    ApprovalPolicy,
    ApprovalRequest,
    Notification,
    NotificationChannel,
    NotificationKind,
    Tenant,
)
from tenants.outbox import outbox_deliver
from tests.conftest import Org, job_spec
from tests.scheduler.test_idle import Cluster, minutes, queued, scan

pytestmark = pytest.mark.django_db
__all__ = ["queued"]  # the fixture, used by name


def hook(tenant: Tenant) -> None:
    Tenant.objects.filter(pk=tenant.pk).update(webhook_url="https://hooks.example.com/h")


def test_a_job_needing_approval_notifies_the_webhook_and_its_deciders_once(org: Org) -> None:
    hook(org.research)
    ApprovalPolicy.objects.create(tenant=org.alpha, rule="gpus_over", threshold=1)
    job, _ = job_submit(user=org.users["alice"], project=org.proj_alpha, payload=job_spec())
    assert job.state == "pending_approval"
    request = ApprovalRequest.objects.get(subject_id=job.pk)
    rows = Notification.objects.filter(kind=NotificationKind.APPROVAL_NEEDED)
    webhook = rows.get(channel=NotificationChannel.WEBHOOK)
    assert webhook.tenant_id == org.research.pk  # alpha has none: the department's
    assert webhook.payload["gantry"]["request"] == request.pk
    assert "alice asks to run job bert-pretrain in 'team-alpha'" in webhook.payload["text"]
    # tina (alpha's admin) and dana (research's) decide; alice asked, so she is not told.
    emails = rows.filter(channel=NotificationChannel.EMAIL).values_list("recipient", flat=True)
    assert sorted(emails) == ["dana@example.com", "tina@example.com"]


def test_an_idle_episode_notifies_the_webhook_once(
    org: Org, queued: list[Any], django_capture_on_commit_callbacks: Any
) -> None:
    hook(org.alpha)
    cluster = Cluster(org)
    job, devices = cluster.job("training")
    cluster.feed(devices, 0, 31, 0.0)
    assert scan(31, django_capture_on_commit_callbacks) == [(job.id, minutes(0))]
    cluster.feed(devices, 31, 40, 0.0)  # the same episode: no second notification
    scan(40, django_capture_on_commit_callbacks)
    [row] = Notification.objects.filter(kind=NotificationKind.IDLE)
    assert (row.tenant_id, row.channel) == (org.alpha.pk, NotificationChannel.WEBHOOK)
    assert row.payload["gantry"]["job"] == job.id
    assert row.payload["gantry"]["idle_since"] == minutes(0).isoformat()


def test_an_approval_email_is_not_sent_once_the_request_is_decided(org: Org) -> None:
    # The outbox sends a second or more after the request is made; a decider may be quicker.
    # Then the other deciders' "approval needed" emails would ask them to decide what is
    # settled: they are dropped with the reason. The webhook (an integration's log) still
    # gets the event, and so does every email of a request still pending.
    hook(org.research)
    ApprovalPolicy.objects.create(tenant=org.alpha, rule="gpus_over", threshold=1)
    decided, _ = job_submit(user=org.users["alice"], project=org.proj_alpha, payload=job_spec())
    waiting, _ = job_submit(
        user=org.users["alice"], project=org.proj_alpha, payload=job_spec(name="second")
    )
    request = ApprovalRequest.objects.get(subject_id=decided.pk)
    approval_decide(user=org.users["tina"], request=request, approve=False, comment="no")
    with patch.object(outbox, "webhook_transport", lambda *_: None):
        outbox_deliver(now=timezone.now())
    rows = Notification.objects.filter(kind=NotificationKind.APPROVAL_NEEDED)
    emails = rows.filter(channel=NotificationChannel.EMAIL)
    dropped = emails.filter(payload__gantry__request=request.pk)
    assert sorted(dropped.values_list("state", flat=True)) == ["dropped", "dropped"]
    assert {r.last_error for r in dropped} == {
        "not sent: the request was rejected before this email went out"
    }
    sent = emails.exclude(payload__gantry__request=request.pk).values_list("state", flat=True)
    assert sorted(sent) == ["sent", "sent"]
    assert [m.subject for m in mail.outbox] == ["[Gantry] approval needed in team-alpha"] * 2
    assert "asks to run job second" in mail.outbox[0].body
    webhooks = rows.filter(channel=NotificationChannel.WEBHOOK).values_list("state", flat=True)
    assert sorted(webhooks) == ["sent", "sent"]
    assert waiting.state == "pending_approval"
