"""Budget alerts at 50, 80 and 100 %: by email to the tenant's admins and to its webhook.

An alert is a row, unique per (budget, threshold), written when a check finds the budget's
position (spent + committed) at or past the threshold: so each goes out once, however many
checks race. Its webhook message goes to the notification outbox in the same transaction
(tenants/outbox.py: retried with backoff, bounded, shown to the tenant's admins); the email
is a Celery task of its own that marks its delivery, so a failing webhook neither stops the
email nor sends it twice. Nothing is sent inside a request or a scheduling cycle.
"""

from __future__ import annotations

import logging
from datetime import datetime

from django.core.mail import send_mail
from django.db import IntegrityError, transaction
from django.utils import timezone

from billing.budgets.spend import THRESHOLDS, BudgetPosition, position_of
from billing.models import Budget, BudgetAlert
from tenants.models import Membership, NotificationKind, Role, Tenant
from tenants.outbox import Event, notifications_add

logger = logging.getLogger(__name__)


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
                        posted_at=timezone.now(),  # handed to the outbox, just below
                    )
                    notifications_add([_event(alert, position)])
            except IntegrityError:
                continue  # sent (or being sent) already
            new.append(alert.pk)
    if new:
        transaction.on_commit(lambda: _enqueue(new))
    return new


def _enqueue(alert_ids: list[int]) -> None:
    from billing.tasks import budget_alert_email  # tasks import this

    for alert_id in alert_ids:
        try:
            budget_alert_email.delay(alert_id)
        except Exception:  # any broker error: the sweep sends it later
            logger.warning("could not queue budget alert %s", alert_id, exc_info=True)


def _event(alert: BudgetAlert, position: BudgetPosition) -> Event:
    """The alert's webhook message (the tenant's admins get the same text by email)."""
    budget = alert.budget
    return Event(
        tenant_id=budget.tenant_id,
        kind=NotificationKind.BUDGET_ALERT,
        text=message(alert, position)[1],
        fields={
            "tenant": budget.tenant.slug,
            "month": budget.month.strftime("%Y-%m"),
            "threshold": alert.threshold,
            "percent": float(position.percent),
            "policy": budget.policy,
        },
    )


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


def alerts_unsent() -> list[int]:
    """Alerts whose email was not sent (a lost queueing)."""
    unsent = BudgetAlert.objects.filter(emailed_at__isnull=True).order_by("pk")
    return list(unsent.values_list("pk", flat=True))
