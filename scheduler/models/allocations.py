"""Allocations: which devices of which node an attempt of a job holds."""

from __future__ import annotations

from django.db import models
from django.db.models import Q

from scheduler.models.jobs import Job
from scheduler.models.nodes import GpuDevice, Node


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
