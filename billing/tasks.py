"""Background work of billing. Tasks are idempotent: two beats, a retry, a rerun are harmless."""

from __future__ import annotations

import logging
from datetime import datetime

from celery import shared_task
from django.conf import settings
from django.utils import timezone

from billing.budgets.alerts import (
    alert_email_send,
    alerts_check,
    alerts_unsent,
)
from billing.budgets.checks import reservations_sweep
from billing.costs.lines import open_month_rated
from billing.exports import runs as export_runs
from billing.metering.gaps import usage_check
from billing.metering.hourly import meter_usage
from billing.statements.closing import months_close_due

logger = logging.getLogger(__name__)


@shared_task
def meter_closed_hours() -> int:
    """Celery beat, hourly: meter every closed hour not metered yet (docs/billing.md), then
    rate the open month once for the cost routes' readers (billing/statements/line_memo.py)."""
    metered = meter_usage(now=timezone.now())
    if metered:
        open_month_rated()
    return metered


@shared_task
def usage_reconcile() -> int:
    """Celery beat: reconcile the allocations against the usage records (billing/
    usage_check.py); logs an error and shows the gaps on /metrics when usage went unmetered.
    The number of gaps."""
    return usage_check(now=timezone.now()).gaps


@shared_task
def close_previous_month() -> int:
    """Celery beat, hourly: once the previous month is metered completely and
    GANTRY_BILLING_CLOSE_AFTER_H hours over, close it for every organisation (idempotent);
    the number of statements this run closed."""
    return len(months_close_due(now=timezone.now()))


# On the `reports` queue (config/settings.py CELERY_TASK_ROUTES). The soft limit ends the
# export failed, saying so; the hard one kills one stuck where the soft one cannot reach (the
# sweep then fails it).
@shared_task(
    soft_time_limit=settings.GANTRY_EXPORT_TIME_LIMIT_S,
    time_limit=settings.GANTRY_EXPORT_TIME_LIMIT_S + 30,
)
def cost_export_run(export_id: int) -> bool:
    """Write a queued finance export's file (billing/exports/runs.py); a second delivery of
    the same message finds it claimed and does nothing."""
    return export_runs.cost_export_run(export_id, clock=timezone.now)


@shared_task
def cost_exports_expire() -> int:
    """Celery beat: delete the finance exports past their retention, files and rows."""
    return export_runs.cost_exports_expire(now=timezone.now())


@shared_task
def budget_alerts_check(tenant_ids: list[int], month: str) -> list[int]:
    """Record and queue the alerts the month's budgets over `tenant_ids` reached."""
    return alerts_check(tenant_ids, datetime.fromisoformat(month))


@shared_task(autoretry_for=(OSError,), retry_backoff=True, retry_backoff_max=600, max_retries=8)
def budget_alert_email(alert_id: int) -> bool:
    return alert_email_send(alert_id)


@shared_task
def budget_sweep() -> int:
    """Celery beat: release the reservations of jobs already final, and send the alert
    emails whose queueing was lost (webhooks are the outbox's). Idempotent."""
    released = reservations_sweep()
    for alert_id in alerts_unsent():
        alert_email_send(alert_id)
    return released
