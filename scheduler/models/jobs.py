"""Jobs, their event history and their queue estimates."""

from __future__ import annotations

from django.conf import settings
from django.db import models
from django.db.models import Q
from django.db.models.fields.json import KeyTransform

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
# The states in which a job holds (or is about to hold) an allocation: its job runs or is about
# to. A job holding devices in any other gives them back (preempted or requeued, its pods
# stopping). Here, beside the states, so that the snapshot and the lifecycle read one list.
HOLDING_STATES = (JobState.ADMITTED, JobState.BINDING, JobState.RUNNING)


class Job(models.Model):
    """A gang of `replicas` identical pods; all run or none.

    The validated spec is kept whole in `spec` (what the user asked for, normalised) and the
    fields the scheduler filters and sums on are copied into columns so that building a
    snapshot is one query without JSON parsing in SQL.
    """

    project = models.ForeignKey(Project, on_delete=models.PROTECT, related_name="jobs")
    # The project's team, copied so that access filters and quota roll-ups need no join.
    # No index of its own on tenant or state: job_tenant_state and job_queue_order (live
    # jobs) lead with them, and every state change of a job pays for each index of the table.
    tenant = models.ForeignKey(
        Tenant, on_delete=models.PROTECT, related_name="jobs", db_index=False
    )
    submitted_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="jobs"
    )
    name = models.CharField(max_length=63)
    job_type = models.CharField(max_length=16, choices=JobType.choices)
    state = models.CharField(max_length=20, choices=JobState.choices, default=JobState.QUEUED)
    # No index: nothing reads jobs by class alone (the queue heads' index holds it), and
    # deleting a class, the one reader, is rare.
    priority_class = models.ForeignKey(PriorityClass, on_delete=models.PROTECT, db_index=False)
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
    # Retry backoff: the daemon does not consider the job before this instant.
    not_before = models.DateTimeField(null=True, blank=True)

    created_at = models.DateTimeField(auto_now_add=True, db_index=True)
    queued_at = models.DateTimeField(null=True, blank=True)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["-created_at", "-id"]
        indexes = [
            models.Index(fields=["tenant", "state"], name="job_tenant_state"),
            # Live jobs only: readers by state alone ask for live states, and a job's last
            # update (to a final state) writes no entry here.
            models.Index(
                fields=["state", "queued_at"],
                condition=Q(state__in=sorted(set(JobState) - FINAL_STATES)),
                name="job_queue_order",
            ),
            # The daemon's queue heads per tenant x priority class (daemon.queue.queue_heads).
            models.Index(
                fields=["tenant", "priority_class", "queued_at", "id"],
                condition=Q(state="queued"),
                name="job_queue_heads",
            ),
            # The job of an object created in Kubernetes, found by the object's uid at every
            # pass of the workload controller (scheduler/workloads/mirror.py): without it, a
            # scan of every job ever submitted per object.
            models.Index(
                KeyTransform("uid", KeyTransform("workload", "spec")), name="job_workload_uid"
            ),
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


# The daemon writes a job's events, allocations and device shares several times per job,
# each in the transaction that changed the job (whose row it holds locked), for jobs, nodes
# and devices that are never deleted but through the ORM, which cascades in Python. Their
# foreign keys to those rows are therefore not checked by the database (`db_constraint=False`):
# a check is a row lock and a write more on the referenced row for every row written.


class JobEvent(models.Model):
    """Append-only history of a job; written in the same transaction as the change."""

    job = models.ForeignKey(
        Job, on_delete=models.CASCADE, related_name="events", db_constraint=False
    )
    # No index of its own: four or more events per job are written, and each index is a write
    # more; the reads by time are served by the partial indexes below.
    at = models.DateTimeField(auto_now_add=True)
    kind = models.CharField(max_length=32)
    from_state = models.CharField(max_length=20, blank=True, default="")
    to_state = models.CharField(max_length=20, blank=True, default="")
    message = models.CharField(max_length=1000, blank=True, default="")
    # Indexed only where set (`jobevent_actor`): the daemon's events have none.
    actor = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, db_index=False
    )
    data = models.JSONField(default=dict, blank=True)

    class Meta:
        ordering = ["at", "id"]
        indexes = [
            # The snapshot reads recent preemptions every cycle (the ping-pong guard), and a
            # dashboard the failures of its window (`scheduler.telemetry.dashboards.FAILURE_KINDS`):
            # a partial index keeps both to those few events, not the whole history.
            models.Index(
                fields=["at"],
                condition=Q(kind__in=["attempt_failed", "bind_failed", "preempted"]),
                name="jobevent_failures_at",
            ),
            # The admissions of a minute, for the queue's wait histogram.
            models.Index(
                fields=["at"], condition=Q(to_state="admitted"), name="jobevent_admitted_at"
            ),
            # A user's deletion sets their events' actor to NULL.
            models.Index(fields=["actor"], condition=Q(actor__isnull=False), name="jobevent_actor"),
        ]

    def __str__(self) -> str:
        return f"{self.kind} {self.from_state}->{self.to_state} of job {self.job_id}"


# --- nodes, devices, allocations, the scheduler lease (the daemon's tables) -----------------


class JobQueueEstimate(models.Model):
    """Where a waiting job stands, as the leading daemon last worked it out
    (scheduler/estimates/refresh.py): its position in its team's queue and in the cluster's order,
    and its expected start.

    Written for the queued jobs of the daemon's snapshot every GANTRY_ETA_EVERY_S, never per
    page view; a job that left the queue loses its row at the next refresh. Positions are
    always from the latest refresh (`computed_at`); an estimate the refresh's budget did not
    reach is kept from an earlier one (`estimated_at`), or is absent."""

    job = models.OneToOneField(
        Job, on_delete=models.CASCADE, primary_key=True, related_name="queue_estimate"
    )
    position_tenant = models.PositiveIntegerField()
    position_cluster = models.PositiveIntegerField()
    # Start times from p50 / p90 runtimes; NULL with `estimated_at` set: not within the horizon.
    eta_p50 = models.DateTimeField(null=True, blank=True)
    eta_p90 = models.DateTimeField(null=True, blank=True)
    estimated_at = models.DateTimeField(null=True, blank=True)
    computed_at = models.DateTimeField()

    class Meta:
        indexes = [models.Index(fields=["position_cluster"], name="jobqueueestimate_position")]

    def __str__(self) -> str:
        return f"job {self.job_id}: #{self.position_cluster} in the cluster"

    @property
    def ahead_count(self) -> int:
        return self.position_cluster - 1


# The utilization history's tables belong to this app (their own module: they are many).
