"""Refresh the demand forecasts now, as Celery beat does every GANTRY_CAPACITY_REFRESH_S
(capacity/refresh.py): after installing, or to see a change of history at once."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError
from django.utils import timezone

from capacity.refresh import forecast_refresh


class Command(BaseCommand):
    help = "Refresh the capacity forecasts now (one refresh at a time)."

    def handle(self, *args: Any, **options: Any) -> None:
        run = forecast_refresh(now=timezone.now())
        if run is None:
            raise CommandError("another refresh is running; try again when it has finished.")
        series = run.series.count()
        self.stdout.write(f"forecast run {run.pk}: {series} series to {run.last_day}")
