"""The organisation tree, memberships and roles, resource flavors, quotas, priority classes."""

from django.conf import settings
from django.core.validators import URLValidator
from django.db import models
from django.db.models import F, Q

from common.models import TimeStampedModel
from common.text import validate_display_text, validate_dns_label


class TenantKind(models.TextChoices):
    ORGANISATION = "organisation"
    DEPARTMENT = "department"
    TEAM = "team"
    GROUP = "group"


class Tenant(TimeStampedModel):
    """A node of the organisation tree; any depth.

    `path` is the materialised path of ids ("/1/4/9/"), so that a subtree is one indexed
    `path__startswith` filter: access checks and quota roll-ups never walk the tree row by row.
    """

    slug = models.CharField(max_length=63, unique=True, validators=[validate_dns_label])
    name = models.CharField(max_length=120, validators=[validate_display_text])
    kind = models.CharField(max_length=16, choices=TenantKind.choices, default=TenantKind.TEAM)
    parent = models.ForeignKey(
        "self", null=True, blank=True, on_delete=models.PROTECT, related_name="children"
    )
    path = models.CharField(max_length=512, db_index=True, editable=False, default="")
    depth = models.PositiveSmallIntegerField(editable=False, default=0)
    # Notifications are posted here as {"text": ...} (Slack and Teams incoming webhooks;
    # tenants/outbox.py), for this tenant and those below it without their own.
    webhook_url = models.URLField(
        max_length=500, blank=True, default="", validators=[URLValidator(schemes=["https"])]
    )
    # Signs every webhook post (tenants/webhooks.py): made when the webhook is set, shown once
    # then and at each rotation, never in a read; kept as is because signing needs it.
    webhook_secret = models.CharField(max_length=100, blank=True, default="", editable=False)
    # Not a column: the secret `tenant_update` made in this request, for its answer alone.
    webhook_secret_new: str | None = None
    # Registry hosts or host/path prefixes its subtree's images may come from; empty: the list
    # above applies (tenants/registries.py).
    allowed_registries = models.JSONField(default=list, blank=True)

    class Meta:
        ordering = ["path"]
        constraints = [
            models.CheckConstraint(condition=~Q(parent=F("id")), name="tenant_not_own_parent"),
        ]

    def __str__(self) -> str:
        return self.slug

    def ancestor_ids(self) -> list[int]:
        """Ids from the root down to and including this tenant."""
        return [int(part) for part in self.path.strip("/").split("/") if part]


class Project(TimeStampedModel):
    """Jobs belong to a project under a team; a project maps to a Kubernetes namespace."""

    tenant = models.ForeignKey(Tenant, on_delete=models.PROTECT, related_name="projects")
    slug = models.CharField(max_length=63, validators=[validate_dns_label])
    name = models.CharField(max_length=120, validators=[validate_display_text])
    namespace = models.CharField(max_length=63, unique=True, validators=[validate_dns_label])

    class Meta:
        ordering = ["tenant_id", "slug"]
        constraints = [
            models.UniqueConstraint(fields=["tenant", "slug"], name="project_slug_unique_in_tenant")
        ]

    def __str__(self) -> str:
        return self.slug


class Role(models.TextChoices):
    MEMBER = "member"
    APPROVER = "approver"
    ADMIN = "admin"


# A higher role includes the powers of the lower ones.
ROLE_RANK: dict[str, int] = {Role.MEMBER: 1, Role.APPROVER: 2, Role.ADMIN: 3}


class Membership(TimeStampedModel):
    """A user's role on a tenant; it holds for the tenant's whole subtree."""

    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="memberships"
    )
    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="memberships")
    role = models.CharField(max_length=16, choices=Role.choices, default=Role.MEMBER)

    class Meta:
        ordering = ["tenant_id", "user_id"]
        constraints = [
            models.UniqueConstraint(fields=["user", "tenant"], name="membership_one_per_tenant")
        ]


class PlatformRoleName(models.TextChoices):
    PLATFORM_ADMIN = "platform_admin"
    FINANCE = "finance"


class PlatformRole(TimeStampedModel):
    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="platform_roles"
    )
    role = models.CharField(max_length=32, choices=PlatformRoleName.choices)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["user", "role"], name="platform_role_unique")
        ]


class FlavorKind(models.TextChoices):
    GPU = "gpu"
    NPU = "npu"


class ResourceFlavor(TimeStampedModel):
    """A GPU or NPU model, e.g. H100-80GB; quotas and job requests name flavors."""

    name = models.CharField(
        max_length=63,
        unique=True,
        validators=[validate_display_text],
        help_text="Model name as nodes report it, e.g. H100-80GB.",
    )
    kind = models.CharField(max_length=8, choices=FlavorKind.choices, default=FlavorKind.GPU)
    resource_name = models.CharField(max_length=120, default="nvidia.com/gpu")
    memory_mib = models.PositiveIntegerField(help_text="Memory of one device, MiB.")
    mig_profiles = models.JSONField(default=list, blank=True)
    node_labels = models.JSONField(default=dict, blank=True)

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name


class FormerFlavorName(models.Model):
    """A name a flavor had before it was renamed. What was recorded under it (allocations,
    usage records, closed statement lines keep the name of their time) still belongs to the
    flavor: billing prices and shows it as the flavor's (billing/rates/cards.py,
    `flavor_renames`). A name stays its flavor's: no other flavor may take it."""

    name = models.CharField(max_length=63, unique=True)
    flavor = models.ForeignKey(
        ResourceFlavor, on_delete=models.CASCADE, related_name="former_names"
    )

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return f"{self.name} (now {self.flavor_id})"


class Quota(TimeStampedModel):
    """Per tenant x flavor, in milli-GPU (1000 = one device).

    `guaranteed` is nominal quota, lent to others while idle; `limit` caps the subtree's use,
    borrowing included; `lend_limit` caps how much of the guarantee others may borrow.
    `cluster` null: the quota holds across every cluster (global); set: it is pinned to that
    cluster's nodes, and its guarantee counts inside the tenant's global one
    (docs/multicluster.md, "Quotas pinned to a cluster"). Readers of the global quota tree
    filter `cluster__isnull=True`.
    """

    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="quotas")
    flavor = models.ForeignKey(ResourceFlavor, on_delete=models.PROTECT, related_name="quotas")
    # By name: tenants sits below scheduler and imports nothing of it.
    cluster = models.ForeignKey(
        "scheduler.Cluster",
        null=True,
        blank=True,
        on_delete=models.PROTECT,
        related_name="pinned_quotas",
        db_index=False,  # a few rows per tenant; the unique index below leads with tenant
    )
    guaranteed_milli = models.PositiveBigIntegerField(default=0)
    limit_milli = models.PositiveBigIntegerField(default=0)
    lend_limit_milli = models.PositiveBigIntegerField(null=True, blank=True)
    weight = models.DecimalField(max_digits=8, decimal_places=3, default=1)
    user_limit_milli = models.PositiveBigIntegerField(
        null=True, blank=True, help_text="Most any one user of the tenant may hold."
    )

    class Meta:
        ordering = ["tenant_id", "flavor_id", "cluster_id"]
        constraints = [
            # NULLs are distinct in a unique index on PostgreSQL and SQLite alike: one
            # constraint for the pinned rows, a partial one for the global row.
            models.UniqueConstraint(
                fields=["tenant", "flavor"],
                condition=Q(cluster__isnull=True),
                name="quota_one_global_per_flavor",
            ),
            models.UniqueConstraint(
                fields=["tenant", "flavor", "cluster"],
                condition=Q(cluster__isnull=False),
                name="quota_one_per_flavor_and_cluster",
            ),
            models.CheckConstraint(
                condition=Q(limit_milli__gte=F("guaranteed_milli")),
                name="quota_limit_at_least_guaranteed",
            ),
            models.CheckConstraint(
                condition=Q(lend_limit_milli__isnull=True)
                | Q(lend_limit_milli__lte=F("guaranteed_milli")),
                name="quota_lend_limit_within_guaranteed",
            ),
            models.CheckConstraint(condition=Q(weight__gt=0), name="quota_weight_positive"),
        ]


class PriorityClass(TimeStampedModel):
    name = models.CharField(max_length=63, unique=True, validators=[validate_dns_label])
    value = models.IntegerField(unique=True)
    may_preempt = models.BooleanField(default=False)
    preemptible = models.BooleanField(default=True)
    counts_against_quota = models.BooleanField(default=True)
    description = models.CharField(max_length=200, blank=True, validators=[validate_display_text])

    class Meta:
        ordering = ["-value"]
        verbose_name_plural = "priority classes"

    def __str__(self) -> str:
        return self.name


class JobType(models.TextChoices):
    TRAINING = "training"
    FINE_TUNING = "fine-tuning"
    INFERENCE = "inference"
    EVALUATION = "evaluation"
    BATCH = "batch"
    INTERACTIVE = "interactive"


class PriorityDefault(TimeStampedModel):
    """The priority class a job type gets when the submitter names none.

    `tenant` null is the platform-wide default; otherwise the nearest ancestor's row wins.
    """

    tenant = models.ForeignKey(
        Tenant, null=True, blank=True, on_delete=models.CASCADE, related_name="priority_defaults"
    )
    job_type = models.CharField(max_length=16, choices=JobType.choices)
    priority_class = models.ForeignKey(PriorityClass, on_delete=models.PROTECT)

    class Meta:
        ordering = ["tenant_id", "job_type"]
        constraints = [
            models.UniqueConstraint(
                fields=["tenant", "job_type"], name="priority_default_unique_per_tenant"
            ),
            models.UniqueConstraint(
                fields=["job_type"],
                condition=Q(tenant__isnull=True),
                name="priority_default_unique_platform",
            ),
        ]


# --- approvals ---------------------------------------------------------------------------


class ApprovalRule(models.TextChoices):
    GPUS_OVER = "gpus_over", "GPUs over N"
    GPU_HOURS_OVER = "gpu_hours_over", "estimated GPU-hours over N"
    PRIORITY_AT_LEAST = "priority_at_least", "priority at or above a class"
    BORROWING = "borrowing", "borrowing beyond guarantee"
    RUNTIME_OVER_HOURS = "runtime_over_hours", "runtime over N hours"
    # Evaluated by billing's admission check (the cost is billing's to know); N in money.
    COST_OVER = "cost_over", "estimated cost over N"


# Rules that compare against `threshold`; `priority_at_least` names a class instead.
THRESHOLD_RULES = (
    ApprovalRule.GPUS_OVER,
    ApprovalRule.GPU_HOURS_OVER,
    ApprovalRule.RUNTIME_OVER_HOURS,
    ApprovalRule.COST_OVER,
)


class ApprovalPolicy(TimeStampedModel):
    """A rule that sends jobs and/or quota requests of the tenant's subtree to approvers.

    The policies of a tenant and of all its ancestors apply to it.
    """

    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="approval_policies")
    rule = models.CharField(max_length=32, choices=ApprovalRule.choices)
    threshold = models.DecimalField(
        max_digits=12,
        decimal_places=3,
        null=True,
        blank=True,
        help_text="GPUs, GPU-hours, hours or money, depending on the rule.",
    )
    priority_class = models.ForeignKey(
        PriorityClass, null=True, blank=True, on_delete=models.PROTECT, related_name="+"
    )
    applies_to_jobs = models.BooleanField(default=True)
    applies_to_quota = models.BooleanField(default=False)
    active = models.BooleanField(default=True)
    description = models.CharField(max_length=200, blank=True, validators=[validate_display_text])
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    # Where it was set from: the tenant whose admins set it (the policy's or an ancestor);
    # None: a platform admin. Changed or removed only from there or above.
    set_at = models.ForeignKey(
        Tenant, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )

    class Meta:
        ordering = ["tenant_id", "id"]
        verbose_name_plural = "approval policies"
        constraints = [
            models.CheckConstraint(
                condition=Q(
                    rule__in=THRESHOLD_RULES,
                    threshold__isnull=False,
                    threshold__gte=0,
                    priority_class__isnull=True,
                )
                | Q(
                    rule=ApprovalRule.PRIORITY_AT_LEAST,
                    threshold__isnull=True,
                    priority_class__isnull=False,
                )
                | Q(
                    rule=ApprovalRule.BORROWING, threshold__isnull=True, priority_class__isnull=True
                ),
                name="approval_policy_rule_arguments",
            ),
            models.CheckConstraint(
                condition=Q(applies_to_jobs=True) | Q(applies_to_quota=True),
                name="approval_policy_applies_to_something",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.tenant_id}:{self.rule}"


class ApprovalKind(models.TextChoices):
    JOB = "job"
    QUOTA = "quota"


class ApprovalState(models.TextChoices):
    PENDING = "pending"
    APPROVED = "approved"
    REJECTED = "rejected"
    EXPIRED = "expired"
    CANCELLED = "cancelled"


DECIDED_STATES = (ApprovalState.APPROVED, ApprovalState.REJECTED)
SETTLED_STATES = (ApprovalState.EXPIRED, ApprovalState.CANCELLED)


class ApprovalRequest(TimeStampedModel):
    """A job or a quota change waiting for an approver.

    `subject_id` is the job's id for job requests and the flavor's id for quota requests, and
    `subject_cluster` the cluster's id of a quota request pinned to one (0 otherwise: a job,
    a global quota), so "one pending request per subject" means one per job, or one per
    tenant x flavor x cluster (a global and a pinned request for one flavor may both be
    pending, issue 38). Plain integers because tenants cannot import the scheduler. `rules`
    holds the matched rules: [{"policy": id | None, "rule": kind, "reason": text}].
    """

    kind = models.CharField(max_length=16, choices=ApprovalKind.choices)
    tenant = models.ForeignKey(Tenant, on_delete=models.PROTECT, related_name="approval_requests")
    requester = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="approval_requests"
    )
    subject_id = models.PositiveBigIntegerField()
    # db_default: the release before this one, opening requests during an upgrade, leaves it
    # out (it opens global ones only).
    subject_cluster = models.PositiveBigIntegerField(default=0, db_default=0)
    payload = models.JSONField(default=dict, blank=True)
    rules = models.JSONField(default=list, blank=True)
    state = models.CharField(
        max_length=16, choices=ApprovalState.choices, default=ApprovalState.PENDING, db_index=True
    )
    decided_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.PROTECT, related_name="+"
    )
    decided_at = models.DateTimeField(null=True, blank=True)
    comment = models.CharField(max_length=1000, blank=True, default="")
    expires_at = models.DateTimeField(db_index=True)
    # The state the requester was last emailed about; makes the notification task idempotent.
    notified_state = models.CharField(max_length=16, blank=True, default="")

    class Meta:
        ordering = ["-created_at", "-id"]
        indexes = [models.Index(fields=["tenant", "state"], name="approval_tenant_state")]
        constraints = [
            # Only one decision can land: the decision fields are set iff the state is final,
            # and an approve/reject names who decided (never the requester).
            models.CheckConstraint(
                condition=Q(
                    state=ApprovalState.PENDING, decided_at__isnull=True, decided_by__isnull=True
                )
                | Q(state__in=DECIDED_STATES, decided_at__isnull=False, decided_by__isnull=False)
                | Q(state__in=SETTLED_STATES, decided_at__isnull=False),
                name="approval_decision_iff_final",
            ),
            models.CheckConstraint(
                condition=~Q(state__in=DECIDED_STATES, decided_by=F("requester")),
                name="approval_not_self_decided",
            ),
            models.UniqueConstraint(
                fields=["kind", "tenant", "subject_id", "subject_cluster"],
                condition=Q(state=ApprovalState.PENDING),
                name="approval_one_pending_per_subject_and_cluster",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.kind} request #{self.pk} ({self.state})"

    @property
    def reasons(self) -> list[str]:
        return [str(rule.get("reason", "")) for rule in self.rules if isinstance(rule, dict)]


# --- audit log ---------------------------------------------------------------------------


class AuditEntry(models.Model):
    """One change, written in the same transaction as the change. Append-only.

    Nothing in the application updates or deletes an entry (no service, no API write route),
    and on PostgreSQL a trigger refuses UPDATE and DELETE. `tenant` scopes who may read the
    entry (admins of its subtree); null means a platform-wide change (flavors, classes).
    """

    at = models.DateTimeField(db_index=True)
    actor = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        null=True,
        blank=True,
        on_delete=models.PROTECT,
        related_name="+",
    )
    # Kept as written so the entry reads the same if the user is renamed; blank = the system.
    actor_name = models.CharField(max_length=150, blank=True, default="")
    action = models.CharField(max_length=64, db_index=True)
    tenant = models.ForeignKey(
        Tenant, null=True, blank=True, on_delete=models.PROTECT, related_name="audit_entries"
    )
    target_type = models.CharField(max_length=64)
    target_id = models.CharField(max_length=64)
    before = models.JSONField(null=True, blank=True)
    after = models.JSONField(null=True, blank=True)

    class Meta:
        ordering = ["-at", "-id"]
        verbose_name_plural = "audit entries"
        indexes = [models.Index(fields=["tenant", "at"], name="audit_tenant_at")]

    def __str__(self) -> str:
        return f"{self.at:%Y-%m-%d %H:%M:%S} {self.actor_name or 'system'} {self.action}"


class IdleAction(models.TextChoices):
    NOTIFY = "notify"  # email the job's owner and the tenant's admins
    NOTIFY_AND_STOP = "notify_and_stop"  # also stop interactive jobs
    NOTHING = "nothing"


class IdleRule(TimeStampedModel):
    """When an allocated GPU counts as idle for a tenant's jobs, and what then happens.

    It holds for the tenant's subtree; the nearest rule up the tree wins, and without one the
    settings' defaults apply (scheduler/telemetry/idle.py). A job is idle while every device it
    holds stays under `threshold_pct`; after `duration_s` of it, `action` is taken once."""

    tenant = models.OneToOneField(Tenant, on_delete=models.CASCADE, related_name="idle_rule")
    threshold_pct = models.FloatField(default=5.0)
    duration_s = models.PositiveIntegerField(default=1800)
    action = models.CharField(max_length=16, choices=IdleAction.choices, default=IdleAction.NOTIFY)
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    # Where it was set from: the tenant whose admins set it (the rule's or an ancestor);
    # None: a platform admin. A rule of the tenant's own (set_at = tenant) may only be
    # stricter than the one in force above it (tenants/idle_rules.py).
    set_at = models.ForeignKey(
        Tenant, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )

    class Meta:
        constraints = [
            models.CheckConstraint(
                condition=Q(threshold_pct__gte=0) & Q(threshold_pct__lte=100),
                name="idle_rule_threshold_pct",
            ),
            models.CheckConstraint(condition=Q(duration_s__gte=60), name="idle_rule_duration"),
        ]

    def __str__(self) -> str:
        return f"idle under {self.threshold_pct} % for {self.duration_s} s: {self.action}"


# --- notifications -----------------------------------------------------------------------


class NotificationKind(models.TextChoices):
    APPROVAL_NEEDED = "approval_needed"
    STARTED = "started"
    FINISHED = "finished"
    FAILED = "failed"
    PREEMPTED = "preempted"
    REQUEUED = "requeued"  # an attempt lost its node; the job waits for its next attempt
    IDLE = "idle"
    BUDGET_ALERT = "budget_alert"
    TEST = "test"  # a tenant admin's test of the webhook


class NotificationChannel(models.TextChoices):
    WEBHOOK = "webhook"  # the tenant's webhook_url, read when delivered
    EMAIL = "email"  # `recipient`


class NotificationState(models.TextChoices):
    PENDING = "pending"
    SENT = "sent"
    FAILED = "failed"  # gave up after GANTRY_NOTIFY_MAX_ATTEMPTS
    # pushed out by newer ones past GANTRY_NOTIFY_MAX_PENDING, or an email no longer worth
    # sending (tenants/outbox.py `_stale`)
    DROPPED = "dropped"


class Notification(models.Model):
    """One message in the outbox (tenants/outbox.py): written in the transaction of the change
    it reports, delivered later by Celery with backoff. `tenant` is the tenant whose webhook
    receives it (for email, the tenant of its subject); the bound on undelivered rows is per
    tenant and channel."""

    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="notifications")
    kind = models.CharField(max_length=16, choices=NotificationKind.choices)
    channel = models.CharField(max_length=8, choices=NotificationChannel.choices)
    recipient = models.CharField(max_length=254, blank=True, default="")
    subject = models.CharField(max_length=200, blank=True, default="")
    # {"text": ..., "gantry": {...}}: what Slack- and Teams-style incoming webhooks accept.
    payload = models.JSONField()
    state = models.CharField(
        max_length=8, choices=NotificationState.choices, default=NotificationState.PENDING
    )
    attempts = models.PositiveSmallIntegerField(default=0)
    next_attempt_at = models.DateTimeField()
    last_attempt_at = models.DateTimeField(null=True, blank=True)
    # The last failed attempt, kept when a later one succeeds (the webhook's health).
    last_error = models.CharField(max_length=500, blank=True, default="")
    last_error_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField()
    sent_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["id"]
        indexes = [
            models.Index(
                fields=["next_attempt_at"],
                condition=Q(state="pending"),
                name="notification_due",
            ),
            models.Index(fields=["tenant", "channel", "state"], name="notification_tenant_state"),
        ]
        constraints = [
            models.CheckConstraint(
                condition=~Q(channel="email") | ~Q(recipient=""), name="notification_email_to"
            ),
        ]

    def __str__(self) -> str:
        return f"{self.kind} to {self.channel} of tenant {self.tenant_id}: {self.state}"
