"""Background work of capacity planning. Idempotent: a second delivery finds the run claimed."""

from __future__ import annotations

from celery import shared_task
from django.utils import timezone


# Celery beat (config/settings.py "capacity-refresh"), on the `reports` queue.
@shared_task
def capacity_refresh() -> int | None:
    """Refresh the demand forecasts (capacity/refresh.py); the run's id, None if one ran."""
    # Imported here: the forecaster loads statsforecast (seconds), which only this task needs.
    from capacity.refresh import forecast_refresh

    run = forecast_refresh(now=timezone.now())
    return run.pk if run else None
