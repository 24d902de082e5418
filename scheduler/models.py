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
            # dashboard the failures of its window (`scheduler.dashboards.FAILURE_KINDS`):
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


class Node(models.Model):
    """A machine as the cluster backend reports it, plus what Gantry decided about it.

    `cordoned_by` tells an admin's cordon ("admin") from the daemon's ("daemon": NotReady or
    an unhealthy GPU); the daemon lifts only its own. `drain_requested` and `sim_failed` are
    requests the daemon applies (web and daemon are separate processes).
    """

    name = models.CharField(max_length=253, unique=True)
    flavor = models.CharField(max_length=63, blank=True, default="")
    pool = models.CharField(max_length=63, default="default")
    cpu_milli = models.PositiveIntegerField(default=0)
    memory_mib = models.PositiveBigIntegerField(default=0)
    rdma = models.PositiveSmallIntegerField(default=0)
    labels = models.JSONField(default=dict, blank=True)
    taints = models.JSONField(default=list, blank=True)
    ready = models.BooleanField(default=True)
    present = models.BooleanField(default=True, help_text="Still listed by the cluster.")
    cordoned = models.BooleanField(default=False)
    # Unschedulable in the cluster itself (`kubectl cordon` by the cluster's admins, or the
    # daemon's own mirrored cordon): nothing new is placed there either way.
    cluster_unschedulable = models.BooleanField(default=False)
    cordoned_by = models.CharField(max_length=16, blank=True, default="")
    cordon_reason = models.CharField(max_length=300, blank=True, default="")
    drain_requested = models.BooleanField(default=False)
    sim_failed = models.BooleanField(
        default=False, help_text="Simulated cluster only: an admin failed this node."
    )
    driver_version = models.CharField(max_length=64, blank=True, default="")
    last_report_at = models.DateTimeField(null=True, blank=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name


class GpuDevice(models.Model):
    """One GPU of a node. `allocated_milli` is kept by a database trigger on
    AllocationDevice and checked to stay within 0..1000: no device is ever given out twice,
    whatever code path writes allocations."""

    node = models.ForeignKey(Node, on_delete=models.CASCADE, related_name="devices")
    index = models.PositiveSmallIntegerField()
    uuid = models.CharField(max_length=64, blank=True, default="")
    model = models.CharField(max_length=63, blank=True, default="")
    memory_mib = models.PositiveIntegerField(default=0)
    healthy = models.BooleanField(default=True)
    health_reason = models.CharField(max_length=200, blank=True, default="")
    allocated_milli = models.IntegerField(default=0, editable=False)
    memory_used_mib = models.PositiveIntegerField(null=True, blank=True)
    utilization_pct = models.FloatField(null=True, blank=True)
    temperature_c = models.FloatField(null=True, blank=True)
    ecc_uncorrected = models.PositiveIntegerField(default=0)
    xid_errors = models.JSONField(default=list, blank=True)
    reported_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["node_id", "index"]
        permissions = [("report_gpu_health", "May post GPU health reports (node agent)")]
        constraints = [
            models.UniqueConstraint(fields=["node", "index"], name="gpu_device_unique_index"),
            models.CheckConstraint(
                condition=Q(allocated_milli__gte=0) & Q(allocated_milli__lte=1000),
                name="gpu_device_never_overallocated",
            ),
        ]

    def __str__(self) -> str:
        return f"GPU {self.index} of node {self.node_id}"


class Allocation(models.Model):
    """One replica of one attempt of a job on a node, from `started_at` to `ended_at`.

    The ledger billing meters. Written by the daemon before the pod is created, so a pod
    without an active allocation is always an orphan. `epoch` is the lease epoch that wrote it.
    """

    job = models.ForeignKey(
        Job, on_delete=models.CASCADE, related_name="allocations", db_constraint=False
    )
    node = models.ForeignKey(
        Node, on_delete=models.PROTECT, related_name="allocations", db_constraint=False
    )
    attempt = models.PositiveIntegerField()
    replica = models.PositiveIntegerField()
    pod_name = models.CharField(max_length=253)
    namespace = models.CharField(max_length=63)
    flavor = models.CharField(max_length=63, blank=True, default="")
    gpu_milli = models.PositiveIntegerField(default=0)
    elastic = models.BooleanField(default=False)
    epoch = models.PositiveBigIntegerField(default=0)
    started_at = models.DateTimeField()
    bound_at = models.DateTimeField(null=True, blank=True)
    ended_at = models.DateTimeField(null=True, blank=True)
    end_reason = models.CharField(max_length=200, blank=True, default="")

    class Meta:
        ordering = ["id"]
        indexes = [models.Index(fields=["ended_at", "job"], name="allocation_active")]
        constraints = [
            models.UniqueConstraint(
                fields=["job", "attempt", "replica"],
                condition=Q(ended_at__isnull=True),
                name="allocation_one_active_per_replica",
            ),
            models.UniqueConstraint(
                fields=["pod_name"],
                condition=Q(ended_at__isnull=True),
                name="allocation_one_active_per_pod",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.pod_name} on node {self.node_id}"


class AllocationDevice(models.Model):
    """The share of one device an allocation holds. `released` flips once, when the
    allocation ends; the trigger then gives the share back to the device."""

    # Indexed by allocation_device_once (allocation, device).
    allocation = models.ForeignKey(
        Allocation,
        on_delete=models.CASCADE,
        related_name="devices",
        db_index=False,
        db_constraint=False,
    )
    device = models.ForeignKey(
        GpuDevice, on_delete=models.PROTECT, related_name="shares", db_constraint=False
    )
    milli = models.PositiveIntegerField()
    memory_mib = models.PositiveIntegerField(default=0)
    released = models.BooleanField(default=False)

    class Meta:
        constraints = [
            models.CheckConstraint(
                condition=Q(milli__gte=1) & Q(milli__lte=1000), name="allocation_device_share"
            ),
            models.UniqueConstraint(fields=["allocation", "device"], name="allocation_device_once"),
        ]

    def __str__(self) -> str:
        return f"{self.milli} milli of device {self.device_id}"


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


class NodeAgent(models.Model):
    """The account a node's agent reports with, bound to that one node.

    Created by `manage.py node_agent_token NODE`: an agent may report only for its node, so a
    leaked token speaks for one node, not for the whole cluster. By name rather than a foreign
    key: the credential may be made before the cluster lists the node.
    """

    user = models.OneToOneField(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="node_agent"
    )
    node_name = models.CharField(max_length=253, unique=True)
    created_at = models.DateTimeField(auto_now_add=True)

    def __str__(self) -> str:
        return f"agent of {self.node_name}"


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


class JobQueueEstimate(models.Model):
    """Where a waiting job stands, as the leading daemon last worked it out (scheduler/eta.py):
    its position in its team's queue and in the cluster's order, and its expected start.

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
from scheduler.metrics_models import EventTally as EventTally  # noqa: E402
from scheduler.metrics_models import EventTallyMark as EventTallyMark  # noqa: E402
from scheduler.utilization_models import JobIdle as JobIdle  # noqa: E402
from scheduler.utilization_models import QueueSnapshot as QueueSnapshot  # noqa: E402
from scheduler.utilization_models import RollupPeriod as RollupPeriod  # noqa: E402
from scheduler.utilization_models import RollupScope as RollupScope  # noqa: E402
from scheduler.utilization_models import RollupWatermark as RollupWatermark  # noqa: E402
from scheduler.utilization_models import UtilizationRollup as UtilizationRollup  # noqa: E402
from scheduler.utilization_models import UtilizationSample as UtilizationSample  # noqa: E402
from scheduler.xid_models import XidEvent as XidEvent  # noqa: E402
