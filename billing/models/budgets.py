"""Budgets, their spend, reservations and alerts."""

from __future__ import annotations

from django.conf import settings
from django.db import models
from django.db.models import Q

from tenants.models import Tenant


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
