"""The books' own rows, beside billing/models.py: what seals a closed statement, what
metering has seen of the allocations, the corrections it proposes to finance, and the
reconciliation of allocations against usage records. Imported by billing/models.py."""

from __future__ import annotations

from django.conf import settings
from django.db import models
from django.db.models import Q

from billing.models.statements import Statement, StatementLine
from scheduler.models import Allocation
from tenants.models import Project, Tenant


class StatementSeal(models.Model):
    """Written last, in the close's transaction, once a statement's lines are in: from then
    on the database refuses any line of it but an adjustment (billing/statements/guards.py). Its own
    row is append-only too."""

    statement = models.OneToOneField(
        Statement, on_delete=models.PROTECT, primary_key=True, related_name="seal"
    )
    sealed_at = models.DateTimeField()

    def __str__(self) -> str:
        return f"seal of statement {self.statement_id}"


class MeteringMark(models.Model):
    """Metering's high-water mark on the allocations (one row): the highest allocation id a
    run has seen. The next run looks at the allocations above it for hours metered before
    they were written (billing/metering/late.py). Ids are given in commit order: the daemon,
    fenced by its lease, is the one writer of allocations; the scheduled reconciliation
    (billing/metering/gaps.py) catches anything else."""

    allocation_id = models.BigIntegerField(default=0)

    def __str__(self) -> str:
        return f"allocations seen up to {self.allocation_id}"


class ProposalState(models.TextChoices):
    PENDING = "pending"
    ACCEPTED = "accepted"


class AdjustmentProposal(models.Model):
    """Usage found after its month was closed: the amount metering proposes to finance as an
    adjustment line of the closed statement, per late allocation. Finance accepts it through
    the adjustment service (`closing.statement_adjust`, `late_usage.proposal_accept`); the
    closed statement itself never changes otherwise."""

    statement = models.ForeignKey(Statement, on_delete=models.PROTECT, related_name="proposals")
    allocation = models.ForeignKey(Allocation, on_delete=models.PROTECT, related_name="+")
    tenant = models.ForeignKey(Tenant, on_delete=models.PROTECT, related_name="+")
    project = models.ForeignKey(Project, on_delete=models.PROTECT, related_name="+")
    amount = models.DecimalField(max_digits=16, decimal_places=2)
    reason = models.CharField(max_length=500)
    state = models.CharField(
        max_length=16, choices=ProposalState.choices, default=ProposalState.PENDING
    )
    created_at = models.DateTimeField()
    line = models.OneToOneField(
        StatementLine, null=True, blank=True, on_delete=models.PROTECT, related_name="+"
    )
    decided_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.PROTECT, related_name="+"
    )

    class Meta:
        ordering = ["-created_at", "-id"]
        constraints = [
            models.UniqueConstraint(
                fields=["statement", "allocation"], name="adjustment_proposal_once"
            ),
            models.CheckConstraint(
                condition=Q(state=ProposalState.PENDING) | Q(line__isnull=False),
                name="adjustment_proposal_accepted_has_line",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.amount} proposed on statement {self.statement_id} ({self.state})"


class UsageCheck(models.Model):
    """One run of the reconciliation of allocations against usage records: over the metered
    hours of [start, end), the (allocation, hour) pairs where an allocation held something
    and no usage record says so. /metrics shows the last one."""

    checked_at = models.DateTimeField()
    start = models.DateTimeField()
    end = models.DateTimeField()
    gaps = models.PositiveIntegerField(default=0)
    # The allocations with a gap, the first few (what an operator looks at first).
    allocations = models.JSONField(default=list, blank=True)

    class Meta:
        ordering = ["-checked_at", "-id"]

    def __str__(self) -> str:
        return f"{self.gaps} gap(s) in [{self.start:%Y-%m-%d}, {self.end:%Y-%m-%d})"
