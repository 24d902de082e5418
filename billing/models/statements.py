"""Statements and their lines, and the billing policy that shapes them."""

from __future__ import annotations

from django.conf import settings
from django.db import models
from django.db.models import F, Q

from tenants.models import Project, Tenant


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
    # Showback only: GPU time held while under the idle threshold (billing/metering/idle.py).
    ALLOCATED_IDLE = "allocated-idle"
    ADJUSTMENT = "adjustment"


class Statement(models.Model):
    """The closed statement of an organisation for a period (a month). Its lines, one per
    (tenant, project, user, flavor, resource, kind, rate), are frozen: the database refuses
    UPDATE and DELETE of both (billing/statements/guards.py); corrections are adjustment lines."""

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
    # The cluster whose usage the line prices, by name (issue 38): lines are per cluster as
    # the rate cards are. "" on lines of nobody's job (idle capacity) and of before clusters.
    # db_default: the release before this one closes statements during an upgrade.
    cluster = models.CharField(max_length=63, blank=True, default="", db_default="")
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
    # amounts adding up to the line's (billing/statements/rollup.py, `split_lines`). The cost API
    # aggregates a closed period by them (billing/costs/lines.py).
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
