"""Utilization history: raw samples per device, their roll-ups, and idle time per job.

Imported by `scheduler.models` (so these belong to the scheduler app). docs/utilization.md
explains the storage choices. Samples are a time series written in bulk and read by time
range: the references to devices, jobs, tenants and projects are not enforced by the
database (no constraint to check on every row of a bulk insert, no index to keep per
column), and the time index is made by the migration (BRIN on PostgreSQL, a B-tree on
SQLite), so the model declares none.
"""

from django.db import models
from django.db.models import Q


def _loose(to: str) -> models.ForeignKey:  # type: ignore[type-arg]
    return models.ForeignKey(
        to,
        null=True,
        blank=True,
        on_delete=models.DO_NOTHING,
        db_constraint=False,
        db_index=False,
        related_name="+",
    )


class UtilizationSample(models.Model):
    """One reading of one device, attributed to the allocation that held it when it was
    written (the largest share on a shared device; none when free)."""

    at = models.DateTimeField()
    device = _loose("scheduler.GpuDevice")
    flavor = models.CharField(max_length=63, blank=True, default="")
    utilization_pct = models.FloatField()
    memory_used_mib = models.PositiveIntegerField(null=True, blank=True)
    power_w = models.FloatField(null=True, blank=True)
    temperature_c = models.FloatField(null=True, blank=True)
    sm_active_pct = models.FloatField(null=True, blank=True)  # NVML GPM (Hopper and newer)
    job = _loose("scheduler.Job")
    tenant = _loose("tenants.Tenant")
    project = _loose("tenants.Project")
    share_milli = models.PositiveSmallIntegerField(default=0)  # the holder's share, 0 if free

    class Meta:
        ordering = ["at", "id"]

    def __str__(self) -> str:
        return f"device {self.device_id} at {self.at:%H:%M:%S}: {self.utilization_pct} %"


class RollupPeriod(models.TextChoices):
    FIVE_MINUTES = "5m"
    HOUR = "1h"


class RollupScope(models.TextChoices):
    DEVICE = "device"
    JOB = "job"
    TENANT = "tenant"
    FLAVOR = "flavor"


class UtilizationRollup(models.Model):
    """Aggregates of the raw samples of one window [start, start + period) for one device,
    job, tenant or flavor (`key_id`: the device, job or tenant id; 0 for a flavor). Every
    scope is per flavor too: a tenant has a row per flavor its jobs used.

    `gpu_seconds` is the allocated GPU time the samples stand for (each sample counts the
    sampling interval times its holder's share); `idle_gpu_seconds` the part of it under the
    holding tenant's idle threshold: billing's "allocated but idle" reads it."""

    period = models.CharField(max_length=2, choices=RollupPeriod.choices)
    scope = models.CharField(max_length=8, choices=RollupScope.choices)
    key_id = models.BigIntegerField(default=0)
    flavor = models.CharField(max_length=63, blank=True, default="")
    start = models.DateTimeField()
    # The job's tenant and project (job scope), for statements and dashboards without a join.
    tenant = _loose("tenants.Tenant")
    project = _loose("tenants.Project")
    samples = models.PositiveIntegerField()
    utilization_mean = models.FloatField()
    utilization_max = models.FloatField()
    utilization_p95 = models.FloatField()
    memory_used_mean_mib = models.FloatField(null=True, blank=True)
    power_mean_w = models.FloatField(null=True, blank=True)
    gpu_seconds = models.FloatField(default=0)
    idle_gpu_seconds = models.FloatField(default=0)

    class Meta:
        ordering = ["period", "scope", "key_id", "start"]
        constraints = [
            models.UniqueConstraint(
                fields=["period", "scope", "key_id", "flavor", "start"], name="rollup_once"
            ),
        ]
        indexes = [
            models.Index(fields=["period", "start"], name="rollup_period_start"),
            # The dashboards' most idle jobs of a range: only the job windows with idle time.
            models.Index(
                fields=["period", "start"],
                condition=Q(scope="job", idle_gpu_seconds__gt=0),
                name="rollup_job_idle",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.period} {self.scope} {self.key_id or self.flavor} at {self.start}"


class RollupWatermark(models.Model):
    """How far a periodic pass over the samples got: every window before `done_until` is
    done. Its row lock serialises two passes of the same kind."""

    name = models.CharField(max_length=16, unique=True)
    done_until = models.DateTimeField()

    def __str__(self) -> str:
        return f"{self.name} done until {self.done_until}"


class JobIdle(models.Model):
    """A job's idle time (Run:ai's rule: idle seconds per workload, reset by activity).

    `idle_since` starts an episode at the first sample with every device under the tenant's
    threshold; a busy sample ends it. `idle_seconds` is the current episode's length;
    `idle_seconds_total` all idle time seen. `acted_for` is the `idle_since` of the episode
    the scan already acted on (queued the email, stopped the job), `notified_for` the one the
    email went out for: once per episode, even when a task is delivered twice."""

    job = models.OneToOneField(
        "scheduler.Job", on_delete=models.CASCADE, primary_key=True, related_name="idle"
    )
    tenant = models.ForeignKey("tenants.Tenant", on_delete=models.CASCADE, related_name="+")
    idle_since = models.DateTimeField(null=True, blank=True)
    last_sample_at = models.DateTimeField(null=True, blank=True)
    idle_seconds = models.FloatField(default=0)
    idle_seconds_total = models.FloatField(default=0)
    acted_for = models.DateTimeField(null=True, blank=True)
    notified_for = models.DateTimeField(null=True, blank=True)  # the email task's own mark

    class Meta:
        indexes = [
            models.Index(
                fields=["tenant"], condition=Q(idle_since__isnull=False), name="jobidle_idle_now"
            )
        ]

    def __str__(self) -> str:
        return f"job {self.job_id} idle {self.idle_seconds:.0f} s"


class QueueSnapshot(models.Model):
    """The queue over one 5-minute window [at, at + 5 min), for the dashboards: what the
    roll-ups cannot give because it is not a sample of a device. Written once a window by
    the roll-up task (scheduler/telemetry/queue_history.py); `tenant` null is the cluster's row.

    `queued_jobs` and `queued_gpus` are read when the row is written (the window's end);
    `admissions`, `wait_sum_s` and `wait_buckets` (counts per bucket of WAIT_BUCKETS_S, one
    more for longer waits) are the admissions in the window and their waits since the job
    last entered the queue. `flavors` (cluster row only): flavor -> [free GPUs, fragmented
    GPUs] at the window's end."""

    at = models.DateTimeField()
    tenant = _loose("tenants.Tenant")
    queued_jobs = models.PositiveIntegerField(default=0)
    queued_gpus = models.FloatField(default=0)
    admissions = models.PositiveIntegerField(default=0)
    wait_sum_s = models.FloatField(default=0)
    wait_buckets = models.JSONField(default=list, blank=True)
    flavors = models.JSONField(default=dict, blank=True)

    class Meta:
        ordering = ["at", "id"]
        constraints = [
            models.UniqueConstraint(
                fields=["at"], condition=Q(tenant__isnull=True), name="queuesnapshot_cluster_once"
            ),
            models.UniqueConstraint(fields=["tenant", "at"], name="queuesnapshot_tenant_once"),
        ]

    def __str__(self) -> str:
        return f"queue at {self.at}: {self.queued_jobs} queued, {self.admissions} admitted"
