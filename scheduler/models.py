"""Jobs and their event history. Nodes, devices and allocations join them with the daemon."""

from django.conf import settings
from django.db import models
from django.db.models import Q

from tenants.models import JobType, PriorityClass, Project, Tenant


class JobState(models.TextChoices):
    PENDING_APPROVAL = "pending_approval"
    QUEUED = "queued"
    ADMITTED = "admitted"
    BINDING = "binding"
    RUNNING = "running"
    PREEMPTED = "preempted"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"
    REJECTED = "rejected"


FINAL_STATES = frozenset(
    {JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED, JobState.REJECTED}
)


class Job(models.Model):
    """A gang of `replicas` identical pods; all run or none.

    The validated spec is kept whole in `spec` (what the user asked for, normalised) and the
    fields the scheduler filters and sums on are copied into columns so that building a
    snapshot is one query without JSON parsing in SQL.
    """

    project = models.ForeignKey(Project, on_delete=models.PROTECT, related_name="jobs")
    # The project's team, copied so that access filters and quota roll-ups need no join.
    tenant = models.ForeignKey(Tenant, on_delete=models.PROTECT, related_name="jobs")
    submitted_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="jobs"
    )
    name = models.CharField(max_length=63)
    job_type = models.CharField(max_length=16, choices=JobType.choices)
    state = models.CharField(
        max_length=20, choices=JobState.choices, default=JobState.QUEUED, db_index=True
    )
    priority_class = models.ForeignKey(PriorityClass, on_delete=models.PROTECT)
    spec = models.JSONField()

    replicas = models.PositiveIntegerField(default=1)
    gpus_per_replica = models.PositiveIntegerField(default=0)
    gpu_milli_per_replica = models.PositiveIntegerField(
        default=0, help_text="Total milli-GPU per replica: gpus*1000 or a share below 1000."
    )
    gpu_memory_mib = models.PositiveIntegerField(null=True, blank=True)
    cpu_milli = models.PositiveIntegerField(default=0)
    memory_mib = models.PositiveIntegerField(default=0)
    flavors = models.JSONField(default=list, blank=True)
    max_runtime_s = models.PositiveIntegerField(null=True, blank=True)

    attempt = models.PositiveIntegerField(default=0)
    # NULL, not "", when absent: the unique constraint applies only to keys actually given.
    idempotency_key = models.CharField(max_length=128, null=True, blank=True)  # noqa: DJ001
    request_hash = models.CharField(max_length=64, blank=True, default="")
    reason = models.CharField(max_length=500, blank=True, default="")

    created_at = models.DateTimeField(auto_now_add=True, db_index=True)
    queued_at = models.DateTimeField(null=True, blank=True)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["-created_at", "-id"]
        indexes = [
            models.Index(fields=["tenant", "state"], name="job_tenant_state"),
            models.Index(fields=["state", "queued_at"], name="job_queue_order"),
        ]
        constraints = [
            models.UniqueConstraint(
                fields=["submitted_by", "idempotency_key"],
                condition=Q(idempotency_key__isnull=False),
                name="job_idempotency_key_unique_per_user",
            ),
            models.CheckConstraint(condition=Q(replicas__gte=1), name="job_replicas_positive"),
        ]

    def __str__(self) -> str:
        return f"{self.name} (#{self.pk})"

    @property
    def is_final(self) -> bool:
        return self.state in FINAL_STATES


class JobEvent(models.Model):
    """Append-only history of a job; written in the same transaction as the change."""

    job = models.ForeignKey(Job, on_delete=models.CASCADE, related_name="events")
    at = models.DateTimeField(auto_now_add=True, db_index=True)
    kind = models.CharField(max_length=32)
    from_state = models.CharField(max_length=20, blank=True, default="")
    to_state = models.CharField(max_length=20, blank=True, default="")
    message = models.CharField(max_length=1000, blank=True, default="")
    actor = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL
    )
    data = models.JSONField(default=dict, blank=True)

    class Meta:
        ordering = ["at", "id"]

    def __str__(self) -> str:
        return f"{self.kind} {self.from_state}->{self.to_state} of job {self.job_id}"
