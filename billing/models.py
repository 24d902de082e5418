"""Rate cards, metered usage, statements. Money is `Decimal` in the database and in Python."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.db import models
from django.db.models import F, Q

from scheduler.models import Allocation
from tenants.models import PriorityClass, Project, ResourceFlavor, Tenant


def price(**kwargs: Any) -> models.DecimalField:
    """A price per unit-hour: up to 10^8 with 6 decimal places (a GiB-hour costs little)."""
    return models.DecimalField(max_digits=14, decimal_places=6, **kwargs)


class RateCard(models.Model):
    """One effective-dated version of a flavor's prices, valid on [valid_from, valid_to).

    The versions of a flavor form one unbroken chain: each starts where the previous ends
    (`billing.rates.rate_card_add` refuses gaps and overlaps); the last may be open-ended
    (`valid_to` null). A version is never changed once the time it covers has been metered,
    except that the open end of the last one is closed when a newer version is added.
    """

    flavor = models.ForeignKey(ResourceFlavor, on_delete=models.PROTECT, related_name="rate_cards")
    valid_from = models.DateTimeField()
    valid_to = models.DateTimeField(null=True, blank=True)
    currency = models.CharField(max_length=3)
    gpu_hour = price(help_text="Price of one whole device for an hour.")
    cpu_core_hour = price(default=0)
    memory_gib_hour = price(default=0)
    # A fraction off the price of capacity borrowed beyond the tenant's guarantee (0.3 = 30 %).
    borrowed_discount = models.DecimalField(max_digits=5, decimal_places=4, default=0)
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.PROTECT, related_name="+"
    )
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["flavor_id", "valid_from"]
        constraints = [
            models.UniqueConstraint(fields=["flavor", "valid_from"], name="rate_card_one_start"),
            models.UniqueConstraint(
                fields=["flavor"], condition=Q(valid_to__isnull=True), name="rate_card_one_open"
            ),
            models.CheckConstraint(
                condition=Q(valid_to__isnull=True) | Q(valid_to__gt=F("valid_from")),
                name="rate_card_ends_after_start",
            ),
            models.CheckConstraint(
                condition=Q(gpu_hour__gte=0, cpu_core_hour__gte=0, memory_gib_hour__gte=0),
                name="rate_card_prices_not_negative",
            ),
            models.CheckConstraint(
                condition=Q(borrowed_discount__gte=0, borrowed_discount__lte=1),
                name="rate_card_discount_fraction",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.flavor_id} from {self.valid_from:%Y-%m-%d %H:%M}"


class RateMultiplier(models.Model):
    """A priority class's price multiplier within one rate card version (absent: 1)."""

    rate_card = models.ForeignKey(RateCard, on_delete=models.CASCADE, related_name="multipliers")
    priority_class = models.ForeignKey(PriorityClass, on_delete=models.PROTECT, related_name="+")
    multiplier = models.DecimalField(max_digits=6, decimal_places=4)

    class Meta:
        ordering = ["rate_card_id", "priority_class_id"]
        constraints = [
            models.UniqueConstraint(
                fields=["rate_card", "priority_class"], name="rate_multiplier_once"
            ),
            models.CheckConstraint(
                condition=Q(multiplier__gte=0), name="rate_multiplier_not_negative"
            ),
        ]

    def __str__(self) -> str:
        return f"x{self.multiplier} for {self.priority_class_id}"


class MeteringPeriod(models.Model):
    """One metered hour, [start, start + 1 h). The row and the hour's usage records are
    written in one transaction, so a row exists iff the hour is metered completely; its
    unique `start` is what makes a second or concurrent run meter nothing twice."""

    start = models.DateTimeField(unique=True)
    end = models.DateTimeField()
    records = models.PositiveIntegerField(default=0)
    metered_at = models.DateTimeField()

    class Meta:
        ordering = ["start"]
        constraints = [
            models.CheckConstraint(condition=Q(end__gt=F("start")), name="metering_period_order")
        ]

    def __str__(self) -> str:
        return f"hour from {self.start:%Y-%m-%d %H:%M}"


class UsageRecord(models.Model):
    """What one allocation held during one metered hour: [start, end) inside the hour.

    Who is charged is copied from the job when the hour is metered (tenant, project, user,
    priority class), so a later move of a project does not re-attribute metered time. The
    unique (allocation, period) is the backstop of "metered once": whatever a metering run
    does, a second record of the same allocation in the same hour cannot be written.
    """

    # Indexed: statements, the hour splits and the forecast read records by their periods.
    # No database constraint: metering writes a record only in the transaction that has just
    # inserted its period, and nothing deletes a period (PROTECT refuses it through the ORM);
    # PostgreSQL would check the key of every record at each hour's commit.
    period = models.ForeignKey(
        MeteringPeriod, on_delete=models.PROTECT, related_name="usage", db_constraint=False
    )
    # Indexed by usage_once (allocation, period). Constrained: an allocation is another
    # transaction's row.
    allocation = models.ForeignKey(
        Allocation, on_delete=models.PROTECT, related_name="+", db_index=False
    )
    start = models.DateTimeField()
    end = models.DateTimeField()
    flavor = models.CharField(max_length=63)
    gpu_milli = models.PositiveIntegerField(default=0)
    cpu_milli = models.PositiveIntegerField(default=0)
    memory_mib = models.PositiveIntegerField(default=0)
    # Who is charged, copied from the job (which references them, constrained). No database
    # constraint here: PostgreSQL checks a foreign key of every record at each hour's commit,
    # a large part of metering's work there. PROTECT still stops a delete through the ORM of
    # a tenant, project or user that has records. No index either (one more write per
    # record): every reader narrows the records by period first (statements, splits, the
    # cost API rate a whole organisation's window), and PROTECT's check on a rare delete of
    # a tenant, project or user may scan the table.
    tenant = models.ForeignKey(
        Tenant, on_delete=models.PROTECT, related_name="+", db_constraint=False, db_index=False
    )
    project = models.ForeignKey(
        Project, on_delete=models.PROTECT, related_name="+", db_constraint=False, db_index=False
    )
    user = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        on_delete=models.PROTECT,
        related_name="+",
        db_constraint=False,
        db_index=False,
    )
    priority_class = models.CharField(max_length=63)
    job_type = models.CharField(max_length=16)
    # Ran on capacity borrowed beyond the tenant's guarantee (a class that does not count
    # against quota runs only there): priced with the rate card's borrowed discount.
    borrowed = models.BooleanField(default=False)
    # end - start in microseconds, written with the record: statements add up quantities as
    # integers in SQL (amount held x micros), exact on every engine.
    micros = models.BigIntegerField(default=0)

    class Meta:
        ordering = ["period_id", "allocation_id"]
        constraints = [
            models.UniqueConstraint(fields=["allocation", "period"], name="usage_once"),
            models.CheckConstraint(condition=Q(end__gt=F("start")), name="usage_interval_order"),
        ]

    def __str__(self) -> str:
        return f"allocation {self.allocation_id} in {self.period_id}"


class GuaranteeRecord(models.Model):
    """A tenant's guaranteed quota of a flavor as metering found it for an hour (quotas keep
    no history of their own): what idle reserved capacity is measured against."""

    period = models.ForeignKey(MeteringPeriod, on_delete=models.PROTECT, related_name="guarantees")
    tenant = models.ForeignKey(Tenant, on_delete=models.PROTECT, related_name="+")
    flavor = models.CharField(max_length=63)
    guaranteed_milli = models.PositiveBigIntegerField()

    class Meta:
        ordering = ["period_id", "tenant_id", "flavor"]
        constraints = [
            models.UniqueConstraint(
                fields=["period", "tenant", "flavor"], name="guarantee_record_once"
            )
        ]

    def __str__(self) -> str:
        return f"{self.guaranteed_milli} milli {self.flavor} of {self.tenant_id}"


class CapacityRecord(models.Model):
    """The devices of a flavor metering found for an hour: available ones, and unavailable
    ones (on a cordoned, not-ready or unschedulable node, or unhealthy). Device ids, so that
    a device used in the hour but gone by metering time still counts as present."""

    period = models.ForeignKey(MeteringPeriod, on_delete=models.PROTECT, related_name="capacity")
    flavor = models.CharField(max_length=63)
    available = models.JSONField(default=list)
    unavailable = models.JSONField(default=list)

    class Meta:
        ordering = ["period_id", "flavor"]
        constraints = [
            models.UniqueConstraint(fields=["period", "flavor"], name="capacity_record_once")
        ]

    def __str__(self) -> str:
        return f"{self.flavor} devices in {self.period_id}"


class IdlePolicy(models.TextChoices):
    CHARGE = "charge", "charge the tenant that holds the guarantee"
    SHOWBACK = "showback", "show it, charge nobody"
    SPREAD = "spread", "spread it over the users of the period, in proportion to their use"


class BillingPolicy(models.Model):
    """Per organisation (a root of the tenant tree): where idle reserved capacity goes."""

    organisation = models.OneToOneField(Tenant, on_delete=models.CASCADE, related_name="+")
    idle_policy = models.CharField(
        max_length=16, choices=IdlePolicy.choices, default=IdlePolicy.CHARGE
    )

    def __str__(self) -> str:
        return f"{self.organisation_id}: {self.idle_policy}"


class LineKind(models.TextChoices):
    USED = "used"
    PREEMPTED = "preempted"
    FAILED = "failed"
    IDLE_RESERVED = "idle-reserved"
    # Showback only: GPU time held while under the idle threshold (billing/idle_usage.py).
    ALLOCATED_IDLE = "allocated-idle"
    ADJUSTMENT = "adjustment"


class Statement(models.Model):
    """The closed statement of an organisation for a period (a month). Its lines, one per
    (tenant, project, user, flavor, resource, kind, rate), are frozen: the database refuses
    UPDATE and DELETE of both (billing/triggers.py); corrections are adjustment lines."""

    organisation = models.ForeignKey(Tenant, on_delete=models.PROTECT, related_name="+")
    period_start = models.DateTimeField()
    period_end = models.DateTimeField()
    currency = models.CharField(max_length=3)
    closed_at = models.DateTimeField()
    closed_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.PROTECT, related_name="+"
    )

    class Meta:
        ordering = ["-period_start", "organisation_id"]
        constraints = [
            models.UniqueConstraint(
                fields=["organisation", "period_start", "period_end"], name="statement_once"
            ),
            models.CheckConstraint(
                condition=Q(period_end__gt=F("period_start")), name="statement_period_order"
            ),
        ]

    def __str__(self) -> str:
        return f"statement of {self.organisation_id} from {self.period_start:%Y-%m-%d}"


class StatementLine(models.Model):
    statement = models.ForeignKey(Statement, on_delete=models.PROTECT, related_name="lines")
    tenant = models.ForeignKey(Tenant, on_delete=models.PROTECT, related_name="+")
    project = models.ForeignKey(
        Project, null=True, blank=True, on_delete=models.PROTECT, related_name="+"
    )
    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.PROTECT, related_name="+"
    )
    flavor = models.CharField(max_length=63, blank=True, default="")
    resource = models.CharField(max_length=16, blank=True, default="")
    kind = models.CharField(max_length=16, choices=LineKind.choices)
    unit = models.CharField(max_length=16, blank=True, default="")
    quantity = models.DecimalField(max_digits=20, decimal_places=6, default=0)
    rate = models.DecimalField(max_digits=20, decimal_places=10, default=0)
    amount = models.DecimalField(max_digits=16, decimal_places=2)
    # False: showback, shown but not charged (idle reserved capacity under that policy).
    charged = models.BooleanField(default=True)
    # The line's parts per job type and priority class, frozen with it at the close:
    # [[job type, priority class, amount, GPU-hours as an exact fraction "n/d"], ...], the
    # amounts adding up to the line's (billing/statements.py, `split_lines`). The cost API
    # aggregates a closed period by them (billing/costs.py).
    split = models.JSONField(default=list, blank=True)
    reason = models.CharField(max_length=500, blank=True, default="")
    author = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.PROTECT, related_name="+"
    )
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["statement_id", "id"]
        constraints = [
            models.CheckConstraint(
                condition=~Q(kind=LineKind.ADJUSTMENT) | (~Q(reason="") & Q(author__isnull=False)),
                name="statement_adjustment_has_reason_and_author",
            )
        ]

    def __str__(self) -> str:
        return f"{self.kind} {self.amount} of {self.tenant_id}"


# --- budgets -------------------------------------------------------------------------------


class BudgetUnit(models.TextChoices):
    MONEY = "money", "money (the installation's currency)"
    GPU_HOURS = "gpu_hours", "GPU-hours"


class BudgetPolicy(models.TextChoices):
    """What happens to a new job that would take a budget to 100 % or beyond."""

    NOTIFY = "notify", "queue it and send the 100 % alert"
    APPROVAL = "approval", "send it to approval, with the budget figures"
    BEST_EFFORT = "best-effort", "run it at the best-effort priority class"
    HARD = "hard", "refuse it, at submit and at approval"


class Budget(models.Model):
    """A tenant's budget for one month (`month`: the month's first instant, UTC), spent by
    its whole subtree. The policy at 100 % is the budget's, so a tenant may be stricter in
    one month than another; a tenant without a budget for the month has no limit."""

    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="+")
    month = models.DateTimeField()
    unit = models.CharField(max_length=16, choices=BudgetUnit.choices, default=BudgetUnit.MONEY)
    limit = models.DecimalField(max_digits=16, decimal_places=2)
    policy = models.CharField(
        max_length=16, choices=BudgetPolicy.choices, default=BudgetPolicy.NOTIFY
    )
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    # Where it was set from: the tenant whose admins set it (the budget's or an ancestor);
    # None: finance or a platform admin. Changed or deleted only from there or above
    # (tenants.access.can_write_rule).
    set_at = models.ForeignKey(
        Tenant, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["-month", "tenant_id"]
        constraints = [
            models.UniqueConstraint(fields=["tenant", "month"], name="budget_once_a_month"),
            models.CheckConstraint(condition=Q(limit__gte=0), name="budget_limit_not_negative"),
        ]

    def __str__(self) -> str:
        return f"budget of {self.tenant_id} for {self.month:%Y-%m}"


class BudgetSpend(models.Model):
    """What a tenant's own jobs (not its subtree's) were metered for in a month, kept up to
    date by metering in the same transaction as the hour's usage records, so that a budget's
    spend is a sum over its subtree's rows instead of a re-rating of the month. Exact to
    1e-6 (rounded once per hour and tenant); statements round once per line."""

    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="+")
    month = models.DateTimeField()
    amount = models.DecimalField(max_digits=20, decimal_places=6, default=0)
    gpu_hours = models.DecimalField(max_digits=20, decimal_places=6, default=0)

    class Meta:
        ordering = ["month", "tenant_id"]
        constraints = [
            models.UniqueConstraint(fields=["tenant", "month"], name="budget_spend_once"),
        ]

    def __str__(self) -> str:
        return f"{self.amount} spent by {self.tenant_id} in {self.month:%Y-%m}"


class BudgetReservation(models.Model):
    """A job's projected cost, reserved when it was admitted (queued without approval, or
    approved). `metered` is what metering has charged the job since, so what it still may
    cost is max(0, amount - metered); released (given back) when the job ends."""

    job = models.OneToOneField("scheduler.Job", on_delete=models.CASCADE, related_name="+")
    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="+")
    amount = models.DecimalField(max_digits=20, decimal_places=6)
    gpu_hours = models.DecimalField(max_digits=20, decimal_places=6)
    metered = models.DecimalField(max_digits=20, decimal_places=6, default=0)
    metered_gpu_hours = models.DecimalField(max_digits=20, decimal_places=6, default=0)
    created_at = models.DateTimeField()
    released_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["created_at", "job_id"]
        indexes = [
            models.Index(
                fields=["tenant"], condition=Q(released_at__isnull=True), name="budget_open_holds"
            )
        ]

    def __str__(self) -> str:
        return f"{self.amount} held for job {self.job_id}"


class BudgetAlert(models.Model):
    """An alert that went out (or is going out): once per budget and threshold."""

    budget = models.ForeignKey(Budget, on_delete=models.CASCADE, related_name="alerts")
    threshold = models.PositiveSmallIntegerField()  # 50, 80 or 100 (%)
    percent = models.DecimalField(max_digits=10, decimal_places=2)
    created_at = models.DateTimeField()
    emailed_at = models.DateTimeField(null=True, blank=True)
    posted_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["budget_id", "threshold"]
        constraints = [
            models.UniqueConstraint(fields=["budget", "threshold"], name="budget_alert_once"),
        ]

    def __str__(self) -> str:
        return f"{self.threshold} % of {self.budget_id}"


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
    # The cost API's validated query, instants as ISO 8601 UTC (billing.exports.query_to_json).
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
from billing.books import (  # noqa: E402, F401
    AdjustmentProposal,
    MeteringMark,
    ProposalState,
    StatementSeal,
    UsageCheck,
)
