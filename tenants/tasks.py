"""Background work of the organisation app. Tasks take ids, re-read, and are idempotent."""

from __future__ import annotations

from celery import shared_task
from django.conf import settings
from django.utils import timezone

from tenants.approvals import approval_expire_due
from tenants.notifications import approval_notification_ids_unsent, approval_notification_send
from tenants.outbox import notification_send as outbox_send
from tenants.outbox import outbox_claim


@shared_task(autoretry_for=(OSError,), retry_backoff=True, max_retries=5)
def approval_notify(request_id: int) -> bool:
    """Email the requester of a decided or expired request (once per state)."""
    return approval_notification_send(request_id)


@shared_task
def approvals_expire() -> int:
    """Celery beat: expire due requests, then send emails that never went out.

    Two beat processes may run it at once; both steps are idempotent.
    """
    now = timezone.now()
    expired = approval_expire_due(now)
    for request_id in approval_notification_ids_unsent(now):
        approval_notification_send(request_id)
    return expired


@shared_task
def notifications_deliver() -> dict[str, int]:
    """Kicked when notifications are written, and Celery beat: claim what is due in the
    outbox (tenants/outbox.py) and queue one `notification_send` per row. Idempotent; two at
    once claim different rows. A broker that fails midway leaves the rest claimed: they are
    due again after their backoff."""
    result, claimed = outbox_claim(now=timezone.now())
    for row_id, attempt in claimed:
        notification_send.delay(row_id, attempt)
    return vars(result)


# One message per task, on the `notifications` queue (config/settings.py CELERY_TASK_ROUTES):
# a webhook post ends within GANTRY_NOTIFY_TIMEOUT_S by itself (tenants/webhooks.py); the
# limits stop an email server, or anything else, that holds the task longer.
@shared_task(
    soft_time_limit=settings.GANTRY_NOTIFY_TIMEOUT_S + 5,
    time_limit=settings.GANTRY_NOTIFY_TIMEOUT_S + 15,
)
def notification_send(row_id: int, attempt: int) -> str | None:
    """Send one claimed notification and record the outcome (a duplicate does nothing)."""
    return outbox_send(row_id, attempt, now=timezone.now())
