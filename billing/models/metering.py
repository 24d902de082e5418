"""Metered usage: the periods, the usage records, guarantees and capacity per hour."""

from __future__ import annotations

from django.conf import settings
from django.db import models
from django.db.models import F, Q

from scheduler.models import Allocation
from tenants.models import Project, Tenant


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
    # The cluster the allocation's node is in, by name when metered (docs/multicluster.md):
    # the key a rate card per cluster, statements and exports will read. "" on records
    # metered before clusters were rows. db_default: the release before this one, metering
    # during an upgrade, leaves it out.
    cluster = models.CharField(max_length=63, blank=True, default="", db_default="")

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
    no history of their own): what idle reserved capacity is measured against. `cluster`:
    "" for the global quota, a cluster's name for a quota pinned to it (issue 38), which
    says where the guarantee's idle share lies (billing/metering/located.py)."""

    period = models.ForeignKey(MeteringPeriod, on_delete=models.PROTECT, related_name="guarantees")
    tenant = models.ForeignKey(Tenant, on_delete=models.PROTECT, related_name="+")
    flavor = models.CharField(max_length=63)
    guaranteed_milli = models.PositiveBigIntegerField()
    # db_default: the release before this one, metering during an upgrade, records global
    # quotas only and leaves it out.
    cluster = models.CharField(max_length=63, blank=True, default="", db_default="")

    class Meta:
        ordering = ["period_id", "tenant_id", "flavor", "cluster"]
        constraints = [
            models.UniqueConstraint(
                fields=["period", "tenant", "flavor", "cluster"],
                name="guarantee_record_once_per_cluster",
            )
        ]

    def __str__(self) -> str:
        return f"{self.guaranteed_milli} milli {self.flavor} of {self.tenant_id}"


class CapacityRecord(models.Model):
    """The devices of a flavor on a cluster metering found for an hour: available ones, and
    unavailable ones (on a cordoned, not-ready or unschedulable node, or unhealthy). Device
    ids, so that a device used in the hour but gone by metering time still counts as present.

    `cluster`: the name of the devices' nodes' cluster (a node without one is the home
    cluster's, as for usage records). Rows metered before clusters were recorded were given
    the home cluster's name by migration 0019; "" from the release before this one, metering
    during an upgrade, is read as the home cluster's too (billing/metering/splits.py)."""

    period = models.ForeignKey(MeteringPeriod, on_delete=models.PROTECT, related_name="capacity")
    flavor = models.CharField(max_length=63)
    cluster = models.CharField(max_length=63, blank=True, default="", db_default="")
    available = models.JSONField(default=list)
    unavailable = models.JSONField(default=list)

    class Meta:
        ordering = ["period_id", "flavor", "cluster"]
        constraints = [
            models.UniqueConstraint(
                fields=["period", "flavor", "cluster"], name="capacity_record_once_per_cluster"
            )
        ]

    def __str__(self) -> str:
        return f"{self.flavor} devices of {self.cluster or 'home'} in {self.period_id}"
