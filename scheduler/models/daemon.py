"""The scheduler daemon's own rows: its lease and the profile it runs."""

from __future__ import annotations

from django.db import models


class SchedulerLease(models.Model):
    """Leadership of the daemon. Times come from the database clock (`now()`), never from
    a daemon's clock; `epoch` rises on every takeover and fences every daemon write."""

    name = models.CharField(max_length=63, unique=True)
    holder = models.CharField(max_length=200, blank=True, default="")
    epoch = models.PositiveBigIntegerField(default=0)
    renewed_at = models.DateTimeField(null=True, blank=True)
    expires_at = models.DateTimeField(null=True, blank=True)
    # The leader's decayed fair-share usage ({"at": daemon clock, "decayed": {tenant: value}}),
    # saved with each renewal so that a standby taking over keeps the tenants' history.
    fair_share = models.JSONField(default=dict, blank=True)
    # How the daemon's cycles go, for /healthz and the platform admins' home page: the last
    # cycle that completed (written every few seconds, not every cycle), and the failures
    # since, with the last one's error. A daemon that fails every cycle still renews its
    # lease, so the lease alone cannot tell a healthy scheduler from a wedged one.
    cycle_ok_at = models.DateTimeField(null=True, blank=True)
    cycle_failed_at = models.DateTimeField(null=True, blank=True)
    cycle_failures = models.PositiveIntegerField(default=0)
    cycle_error = models.CharField(max_length=500, blank=True, default="")

    def __str__(self) -> str:
        return f"{self.name}: {self.holder} (epoch {self.epoch})"


class SchedulingProfileRecord(models.Model):
    """The scheduling profile the leading daemon runs, as it last loaded it: one row, kept
    for platform admins (the portal's scheduler profile page). Written by the daemon when it
    takes the lead and whenever its profile file changes; a file it refused is recorded
    beside the profile it kept (`refused_*`)."""

    id = models.PositiveSmallIntegerField(primary_key=True, default=1)
    name = models.CharField(max_length=200)
    path = models.CharField(max_length=1000, blank=True, default="")  # "": built-in defaults
    sha256 = models.CharField(max_length=64)
    document = models.JSONField()
    loaded_at = models.DateTimeField()
    loaded_by = models.CharField(max_length=200, blank=True, default="")
    refused_sha256 = models.CharField(max_length=64, blank=True, default="")
    refused_errors = models.JSONField(default=list, blank=True)
    refused_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        constraints = [
            models.CheckConstraint(condition=models.Q(id=1), name="scheduling_profile_one_row")
        ]

    def __str__(self) -> str:
        return f"profile {self.name} from {self.path or 'the built-in defaults'}"
