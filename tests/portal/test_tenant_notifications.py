"""The tenant's idle rule and notifications page (issue 20): everyone who sees the tenant reads
the rule in force; its admins set it, set the webhook, see the webhook's health (never its
secret path) and send a test, which only queues a notification."""

from __future__ import annotations

from typing import Any

import pytest
from django.urls import reverse

from tenants import outbox
from tenants.models import IdleRule, Notification, NotificationState, Tenant
from tests.conftest import Org

pytestmark = pytest.mark.django_db
SECRET = "https://hooks.slack.com/services/T000/B000/XXXXsecretXXXX"


def page(org: Org, name: str = "tenant-notifications") -> str:
    return reverse(f"portal:{name}", args=[org.alpha.pk])


def test_a_member_reads_the_rule_in_force_but_no_form_and_no_webhook(
    org: Org, web_for: Any
) -> None:
    IdleRule.objects.create(tenant=org.research, threshold_pct=7, duration_s=3600)
    Tenant.objects.filter(pk=org.alpha.pk).update(webhook_url=SECRET)
    response = web_for("alice").get(page(org))
    text = response.content.decode()
    assert response.status_code == 200
    assert "<b>7 %</b>" in text and "<b>60 minutes</b>" in text
    assert "Inherited from a tenant above" in text
    assert 'id="idle-rule-form"' not in text and 'id="webhook-health"' not in text
    assert "hooks.slack.com" not in text
    body = {"threshold_pct": "1", "duration_minutes": "5", "action": "nothing"}
    assert web_for("alice").post(page(org), body).status_code == 403
    assert web_for("alice").post(page(org, "tenant-webhook-test")).status_code == 403
    assert (
        web_for("alice").post(page(org, "tenant-webhook"), {"webhook_url": ""}).status_code == 403
    )
    assert not IdleRule.objects.filter(tenant=org.alpha).exists()
    assert Tenant.objects.get(pk=org.alpha.pk).webhook_url == SECRET


def test_a_one_minute_rule_reads_1_minute(org: Org, web_for: Any) -> None:
    """Issue 35: the page said "1 minutes"."""
    IdleRule.objects.create(tenant=org.alpha, threshold_pct=5, duration_s=60)
    text = web_for("alice").get(page(org)).content.decode()
    assert "<b>1 minute</b>" in text and "1 minutes" not in text


def test_an_admin_sets_the_rule_and_a_bad_value_is_a_400_on_the_field(
    org: Org, web_for: Any
) -> None:
    tina = web_for("tina")
    bad = tina.post(page(org), {"threshold_pct": "120", "duration_minutes": "0", "action": "x"})
    assert bad.status_code == 400
    assert bad.content.decode().count('class="errors"') == 3
    assert not IdleRule.objects.exists()
    # Looser than the rule in force above (the defaults: 5 %, 30 minutes): refused.
    looser = {"threshold_pct": "12.5", "duration_minutes": "45", "action": "notify_and_stop"}
    refused = tina.post(page(org), looser)
    assert refused.status_code == 400 and "must be at most 30" in refused.content.decode()
    assert not IdleRule.objects.exists()
    good = {"threshold_pct": "12.5", "duration_minutes": "25", "action": "notify_and_stop"}
    assert tina.post(page(org), good).status_code == 302
    rule = IdleRule.objects.get(tenant=org.alpha)
    assert (rule.threshold_pct, rule.duration_s, rule.action) == (12.5, 1500, "notify_and_stop")
    assert "This is team-alpha's own rule" in tina.get(page(org)).content.decode()
    assert tina.post(page(org, "tenant-idle-rule-delete")).status_code == 302
    assert not IdleRule.objects.exists()


def test_an_admin_sees_the_health_without_the_secret_and_a_test_only_queues(
    org: Org, web_for: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    def never(url: str, body: bytes, headers: Any = None) -> None:
        raise AssertionError("the webhook was called inside the request")

    monkeypatch.setattr(outbox, "webhook_transport", never)
    tina = web_for("tina")
    refused = tina.post(page(org, "tenant-webhook"), {"webhook_url": "http://x.example.com/h"})
    assert refused.status_code == 400
    assert Tenant.objects.get(pk=org.alpha.pk).webhook_url == ""  # https only
    saved = tina.post(page(org, "tenant-webhook"), {"webhook_url": SECRET})
    signing = Tenant.objects.get(pk=org.alpha.pk).webhook_secret
    # A new webhook's signing secret is shown in that answer alone, as is a rotated one.
    assert saved.status_code == 200 and signing and signing in saved.content.decode()
    assert web_for("alice").post(page(org, "tenant-webhook-secret")).status_code == 403
    rotated = tina.post(page(org, "tenant-webhook-secret"))
    new = Tenant.objects.get(pk=org.alpha.pk).webhook_secret
    assert rotated.status_code == 200 and new != signing and new in rotated.content.decode()
    assert tina.post(page(org, "tenant-webhook-test")).status_code == 302
    [row] = Notification.objects.all()
    assert (row.kind, row.state) == ("test", NotificationState.PENDING)
    text = tina.get(page(org)).content.decode()
    assert "https://hooks.slack.com/…" in text and "XXXXsecretXXXX" not in text
    assert new not in text
    assert '<td id="webhook-undelivered">1</td>' in text


def test_an_http_webhook_is_refused_with_the_field_error(org: Org, web_for: Any) -> None:
    response = web_for("tina").post(page(org, "tenant-webhook"), {"webhook_url": "http://x.io/h"})
    assert response.status_code == 400
    assert 'id="field-webhook_url"' in response.content.decode()
    assert Tenant.objects.get(pk=org.alpha.pk).webhook_url == ""
