"""Finance exports run as Celery work."""

from __future__ import annotations

from django.conf import settings
from django.db import models
from django.db.models import F, Q


class ExportState(models.TextChoices):
    QUEUED = "queued"
    RUNNING = "running"
    DONE = "done"
    FAILED = "failed"


class ExportFormat(models.TextChoices):
    CSV = "csv", "CSV, one row per value of the aggregation"
    XLSX = "xlsx", "XLSX, one row per value of the aggregation"
    FOCUS = "focus", "FOCUS CSV, one row per cost line"


class CostExport(models.Model):
    """A finance export written by a Celery task (billing.tasks.cost_export_run) into
    `GANTRY_EXPORT_DIR`, downloadable by its owner alone until `expires_at`; the beat task
    `cost_exports_expire` deletes the file and the row afterwards."""

    owner = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="cost_exports"
    )
    # The cost API's validated query, instants as ISO 8601 UTC
    # (billing.exports.formats.query_to_json).
    query = models.JSONField()
    format = models.CharField(max_length=8, choices=ExportFormat.choices)
    state = models.CharField(max_length=8, choices=ExportState.choices, default=ExportState.QUEUED)
    progress_done = models.PositiveIntegerField(default=0)
    progress_total = models.PositiveIntegerField(default=0)
    # Relative to GANTRY_EXPORT_DIR; empty until the file is complete.
    file = models.CharField(max_length=255, blank=True, default="")
    filename = models.CharField(max_length=120)
    size = models.PositiveBigIntegerField(default=0)
    rows = models.PositiveIntegerField(default=0)
    error = models.CharField(max_length=500, blank=True, default="")
    created_at = models.DateTimeField()
    finished_at = models.DateTimeField(null=True, blank=True)
    expires_at = models.DateTimeField()

    class Meta:
        ordering = ["-created_at", "-id"]
        indexes = [models.Index(fields=["expires_at"], name="cost_export_expiry")]
        constraints = [
            models.CheckConstraint(
                condition=Q(progress_done__lte=F("progress_total")),
                name="cost_export_progress_bounded",
            ),
            models.CheckConstraint(
                condition=Q(expires_at__gt=F("created_at")), name="cost_export_expires_later"
            ),
        ]

    def __str__(self) -> str:
        return f"{self.format} export {self.pk} of {self.owner_id} ({self.state})"


# The books' seals, metering's mark, proposed adjustments and usage checks (their module).
