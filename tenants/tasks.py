"""Background work of the organisation app. Tasks take ids, re-read, and are idempotent."""

from __future__ import annotations

from celery import shared_task
from django.utils import timezone

from tenants.approvals import approval_expire_due
from tenants.notifications import approval_notification_ids_unsent, approval_notification_send
from tenants.outbox import outbox_deliver


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
    """Kicked when notifications are written, and Celery beat: send what is due in the
    outbox (tenants/outbox.py). Idempotent; two at once skip each other's rows."""
    return vars(outbox_deliver(now=timezone.now()))
