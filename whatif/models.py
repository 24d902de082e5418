"""A what-if run: who asked, over which scope and window, the proposed changes, and what the
replay found. Kept GANTRY_WHATIF_RETENTION_DAYS after it finishes (`whatif.runs`)."""

from django.conf import settings
from django.db import models
from django.db.models import Q

from tenants.models import ApprovalRequest, Tenant
from whatif.describe import change_describe

MAX_WINDOW_DAYS = 90


class WhatIfState(models.TextChoices):
    QUEUED = "queued"
    RUNNING = "running"
    DONE = "done"
    FAILED = "failed"


class WhatIf(models.Model):
    requested_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="what_ifs"
    )
    # The subtree the run was asked for; None: the whole platform (platform admins only).
    scope = models.ForeignKey(
        Tenant, null=True, blank=True, on_delete=models.CASCADE, related_name="what_ifs"
    )
    window_days = models.PositiveSmallIntegerField(default=14)
    # The validated proposal (`whatif.proposal`): [{"kind": "quota" | "priority_class", ...}].
    changes = models.JSONField(default=list)
    # The quota request whose change this replays, so that its approver sees the effect.
    approval = models.ForeignKey(
        ApprovalRequest, null=True, blank=True, on_delete=models.SET_NULL, related_name="what_ifs"
    )
    state = models.CharField(max_length=8, choices=WhatIfState.choices, default=WhatIfState.QUEUED)
    progress = models.PositiveSmallIntegerField(default=0)
    stage = models.CharField(max_length=200, blank=True, default="")
    # Per side, per tenant (every tenant: what a viewer sees is cut from it, `whatif.present`).
    results = models.JSONField(null=True, blank=True)
    error = models.CharField(max_length=500, blank=True, default="")
    created_at = models.DateTimeField()
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    expires_at = models.DateTimeField(db_index=True)

    class Meta:
        ordering = ["-created_at", "-id"]
        constraints = [
            models.CheckConstraint(
                condition=Q(window_days__gte=1, window_days__lte=MAX_WINDOW_DAYS),
                name="whatif_window_days_range",
            ),
            models.CheckConstraint(condition=Q(progress__lte=100), name="whatif_progress_pct"),
            # One run queued or running per person (whatif/runs.py's allowance, kept here
            # against two starts at once).
            models.UniqueConstraint(
                fields=["requested_by"],
                condition=Q(state__in=["queued", "running"]),
                name="whatif_one_active_per_person",
            ),
        ]

    def __str__(self) -> str:
        return f"what-if {self.pk} ({self.state})"

    @property
    def changes_described(self) -> list[str]:
        """Each proposed change in words, each figure with its unit (`whatif.describe`)."""
        return [change_describe(change) for change in self.changes]
