"""Budget alerts at 50, 80 and 100 %: by email to the tenant's admins and to its webhook.

An alert is a row, unique per (budget, threshold), written when a check finds the budget's
position (spent + committed) at or past the threshold: so each goes out once, however many
checks race. Sending is separate (Celery tasks with retry and backoff, never inside a request
or a scheduling cycle); the email and the webhook are two tasks, each marking its own
delivery, so a failing webhook neither stops the email nor sends it twice.
"""

from __future__ import annotations

import json
import logging
import urllib.request
from collections.abc import Callable
from datetime import datetime
from typing import Any

from django.core.mail import send_mail
from django.db import IntegrityError, transaction
from django.utils import timezone

from billing.budgets import THRESHOLDS, BudgetPosition, position_of
from billing.models import Budget, BudgetAlert
from tenants.models import Membership, Role, Tenant

logger = logging.getLogger(__name__)

WEBHOOK_TIMEOUT_S = 10

# (url, JSON body) -> None; raises OSError when the post failed. Tests replace it.
Transport = Callable[[str, bytes], None]


def _post(url: str, body: bytes) -> None:
    request = urllib.request.Request(  # noqa: S310 - the URL is validated https
        url, data=body, headers={"Content-Type": "application/json"}, method="POST"
    )
    with urllib.request.urlopen(request, timeout=WEBHOOK_TIMEOUT_S) as response:  # noqa: S310
        response.read()


webhook_transport: Transport = _post


def budgets_touched(tenant_ids: list[int], month: datetime) -> list[Budget]:
    """The month's budgets of `tenant_ids` and of their ancestors."""
    ids: set[int] = set()
    for tenant in Tenant.objects.filter(pk__in=tenant_ids):
        ids.update(tenant.ancestor_ids())
    return list(Budget.objects.filter(tenant_id__in=ids, month=month).select_related("tenant"))


def alerts_check(tenant_ids: list[int], month: datetime) -> list[int]:
    """Record the alerts the month's budgets over `tenant_ids` have reached and queue their
    sending once committed. Idempotent. Returns the ids of the alerts this call recorded."""
    new: list[int] = []
    for budget in budgets_touched(tenant_ids, month):
        position = position_of(budget)
        for threshold in THRESHOLDS:
            if position.percent < threshold:
                break
            try:
                with transaction.atomic():
                    alert = BudgetAlert.objects.create(
                        budget=budget,
                        threshold=threshold,
                        percent=position.percent,
                        created_at=timezone.now(),
                    )
            except IntegrityError:
                continue  # sent (or being sent) already
            new.append(alert.pk)
    if new:
        transaction.on_commit(lambda: _enqueue(new))
    return new


def _enqueue(alert_ids: list[int]) -> None:
    from billing.tasks import budget_alert_email, budget_alert_webhook  # tasks import this

    for alert_id in alert_ids:
        for task in (budget_alert_email, budget_alert_webhook):
            try:
                task.delay(alert_id)
            except Exception:  # any broker error: the sweep sends it later
                logger.warning("could not queue budget alert %s", alert_id, exc_info=True)


def message(alert: BudgetAlert, position: BudgetPosition) -> tuple[str, str]:
    """Subject and text of an alert (the text is also the webhook's)."""
    budget = alert.budget
    month = budget.month.strftime("%Y-%m")
    subject = f"[Gantry] {budget.tenant.slug}'s budget for {month} reached {alert.threshold} %"
    text = (
        f"{budget.tenant.slug}'s budget for {month} is at {position.percent_text} % "
        f"(crossed {alert.threshold} %): spent {position.figure(position.spent)}, "
        f"committed {position.figure(position.committed)} of {position.figure(position.limit)}. "
        f"At 100 % new jobs are handled by the policy '{budget.policy}'."
    )
    return subject, text


def _locked(alert_id: int) -> BudgetAlert | None:
    return (
        BudgetAlert.objects.select_for_update(of=("self",))
        .select_related("budget__tenant")
        .filter(pk=alert_id)
        .first()
    )


@transaction.atomic
def alert_email_send(alert_id: int) -> bool:
    """Email the admins of the budget's tenant, once: the row lock serialises two deliveries
    and `emailed_at` marks it sent; a mail error rolls the mark back, so a retry sends it."""
    alert = _locked(alert_id)
    if alert is None or alert.emailed_at is not None:
        return False
    tenant = alert.budget.tenant
    to = sorted(
        set(
            Membership.objects.filter(tenant=tenant, role=Role.ADMIN)
            .exclude(user__email="")
            .values_list("user__email", flat=True)
        )
    )
    if to:
        subject, text = message(alert, position_of(alert.budget))
        send_mail(subject, text + "\n", None, to)
    alert.emailed_at = timezone.now()
    alert.save(update_fields=["emailed_at"])
    return bool(to)


@transaction.atomic
def alert_webhook_post(alert_id: int) -> bool:
    """Post the alert to the tenant's webhook, once (as the email). A failure raises OSError
    (the task retries with backoff) and leaves the alert unposted."""
    alert = _locked(alert_id)
    if alert is None or alert.posted_at is not None:
        return False
    url = alert.budget.tenant.webhook_url
    if url:
        _, text = message(alert, position_of(alert.budget))
        # {"text": ...} is what Slack's and Teams' incoming webhooks accept.
        webhook_transport(url, json.dumps({"text": text}).encode())
    alert.posted_at = timezone.now()
    alert.save(update_fields=["posted_at"])
    return bool(url)


def alerts_unsent() -> list[tuple[int, bool, bool]]:
    """(alert, email unsent, webhook unsent) of alerts not delivered (a lost queueing)."""
    rows: Any = BudgetAlert.objects.filter(emailed_at__isnull=True) | BudgetAlert.objects.filter(
        posted_at__isnull=True
    )
    return [(a.pk, a.emailed_at is None, a.posted_at is None) for a in rows.order_by("pk")]
