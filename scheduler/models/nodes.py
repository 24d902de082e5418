"""Nodes, their GPUs and the node agents that report on them."""

from __future__ import annotations

from django.conf import settings
from django.db import models
from django.db.models import Q


class Node(models.Model):
    """A machine as the cluster backend reports it, plus what Gantry decided about it.

    `cordoned_by` tells an admin's cordon ("admin") from the daemon's ("daemon": NotReady or
    an unhealthy GPU); the daemon lifts only its own. `drain_requested` and `sim_failed` are
    requests the daemon applies (web and daemon are separate processes).
    """

    name = models.CharField(max_length=253, unique=True)
    # None: the home cluster (a node a daemon of the release before clusters inserted).
    cluster = models.ForeignKey(
        "scheduler.Cluster",
        null=True,
        blank=True,
        on_delete=models.PROTECT,
        related_name="nodes",
        db_index=False,  # a few thousand rows, read whole: an index would only cost writes
    )
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
