"""Forecast runs (one per refresh, by Celery beat: never at a page view) and what each found:
per pool (GPU model, a flavor's name) and per tenant subtree, the daily history and the
forecast with its band."""

from __future__ import annotations

from django.db import models
from django.db.models import Q

from tenants.models import Tenant


class ForecastRunState(models.TextChoices):
    RUNNING = "running"
    DONE = "done"
    FAILED = "failed"


class ForecastRun(models.Model):
    started_at = models.DateTimeField()
    finished_at = models.DateTimeField(null=True, blank=True)
    state = models.CharField(
        max_length=8, choices=ForecastRunState.choices, default=ForecastRunState.RUNNING
    )
    # The last whole day (UTC) of the history; the forecast starts the day after.
    last_day = models.DateField()
    history_days = models.PositiveSmallIntegerField()
    horizon_days = models.PositiveSmallIntegerField()
    method = models.CharField(max_length=200, blank=True, default="")
    baseline = models.CharField(max_length=200, blank=True, default="")
    error = models.CharField(max_length=500, blank=True, default="")

    class Meta:
        ordering = ["-started_at", "-id"]
        constraints = [
            # One refresh at a time: a second beat tick while one runs finds it and stops.
            models.UniqueConstraint(
                fields=["state"], condition=Q(state="running"), name="forecast_run_one_running"
            ),
        ]

    def __str__(self) -> str:
        return f"forecast run {self.pk} ({self.state}, to {self.last_day})"


class PoolForecast(models.Model):
    """One pool's series for one subtree (`tenant`), or for the whole pool (`tenant` None).

    Lists are daily GPU-hours: `requested` (jobs from creation to end: the queue's waits
    included), `allocated` (allocations) and `used` (the utilization roll-ups) for the
    `history_days` days to the run's `last_day`; `p10`, `p50`, `p90` and `baseline` for the
    `horizon_days` days after it. `capacity_gpus`: the pool's healthy GPUs at the refresh."""

    run = models.ForeignKey(ForecastRun, on_delete=models.CASCADE, related_name="series")
    flavor = models.CharField(max_length=63)
    tenant = models.ForeignKey(
        Tenant, null=True, blank=True, on_delete=models.CASCADE, related_name="+"
    )
    requested = models.JSONField(default=list)
    allocated = models.JSONField(default=list)
    used = models.JSONField(default=list)
    p10 = models.JSONField(default=list)
    p50 = models.JSONField(default=list)
    p90 = models.JSONField(default=list)
    baseline = models.JSONField(default=list)
    method = models.CharField(max_length=200, blank=True, default="")
    capacity_gpus = models.FloatField(default=0)

    class Meta:
        ordering = ["run_id", "flavor", "tenant_id"]
        constraints = [
            models.UniqueConstraint(
                fields=["run", "flavor"],
                condition=Q(tenant__isnull=True),
                name="pool_forecast_one_whole_pool",
            ),
            models.UniqueConstraint(
                fields=["run", "flavor", "tenant"],
                condition=Q(tenant__isnull=False),
                name="pool_forecast_one_per_subtree",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.flavor} / {self.tenant_id or 'pool'} (run {self.run_id})"
