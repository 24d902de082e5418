"""Background work of billing. Tasks are idempotent: two beats, a retry, a rerun are harmless."""

from __future__ import annotations

from datetime import datetime

from celery import shared_task
from django.utils import timezone

from billing.budget_alerts import alert_email_send, alerts_check
from billing.metering import meter_usage


@shared_task
def meter_closed_hours() -> int:
    """Celery beat, hourly: meter every closed hour not metered yet (docs/billing.md)."""
    return meter_usage(now=timezone.now())


@shared_task
def budget_alerts_check(tenant_ids: list[int], month: str) -> list[int]:
    """Record and queue the alerts the month's budgets over `tenant_ids` reached."""
    return alerts_check(tenant_ids, datetime.fromisoformat(month))


@shared_task(autoretry_for=(OSError,), retry_backoff=True, retry_backoff_max=600, max_retries=8)
def budget_alert_email(alert_id: int) -> bool:
    return alert_email_send(alert_id)
