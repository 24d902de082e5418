"""Background work of billing. Tasks are idempotent: two beats, a retry, a rerun are harmless."""

from __future__ import annotations

from celery import shared_task
from django.utils import timezone

from billing.metering import meter_usage


@shared_task
def meter_closed_hours() -> int:
    """Celery beat, hourly: meter every closed hour not metered yet (docs/billing.md)."""
    return meter_usage(now=timezone.now())
