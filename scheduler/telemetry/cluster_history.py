"""Utilization history per cluster (issue 38): GPUs allocated and used in each cluster over a
dashboard range, from the device roll-ups that exist (`UtilizationRollup`, scope `device`).

A device's cluster is its node's (`Node.cluster`; a node without one is the home cluster's,
as everywhere: docs/multicluster.md). The roll-ups keep no cluster, so each row's is read
through its device in the same query (a correlated subquery on the device's primary key), and
the database sums per cluster and window: one query whatever the range, the number of devices
or of clusters. A device removed since has no cluster to read and is left out, as it is from
the Clusters page's inventory.
"""

from __future__ import annotations

from collections import defaultdict

from django.conf import settings
from django.db.models import F, FloatField, OuterRef, Subquery, Sum
from django.db.models.functions import Coalesce

from scheduler.models import Cluster, GpuDevice, RollupScope, UtilizationRollup
from scheduler.telemetry.dashboards import CapacityPoint, Window


def utilization_by_cluster(
    window: Window, cluster: Cluster | None = None
) -> dict[str, list[CapacityPoint]]:
    """cluster name -> its points over `window`, oldest first (each window's mean GPUs
    allocated, and busy GPU-equivalents: devices x their mean utilization, as the cluster
    dashboard's per flavor); `cluster`: that one only. Clusters by name."""
    home = Cluster.objects.filter(home=True).values("name")[:1]
    of_device = GpuDevice.objects.filter(pk=OuterRef("key_id")).values(
        name=Coalesce("node__cluster__name", Subquery(home))
    )
    rows = (
        UtilizationRollup.objects.filter(
            period=window.period,
            start__gte=window.since,
            start__lt=window.until,
            scope=RollupScope.DEVICE,
        )
        .annotate(cluster=Subquery(of_device[:1]))
        .exclude(cluster__isnull=True)
    )
    if cluster is not None:
        rows = rows.filter(cluster=cluster.name)
    sums = (
        rows.values("cluster", "start")
        .annotate(
            held=Sum("gpu_seconds"),
            busy=Sum(F("utilization_mean") * F("samples"), output_field=FloatField()),
        )
        .order_by("cluster", "start")
    )
    interval, step = settings.GANTRY_UTILIZATION_SAMPLE_S, window.step.total_seconds()
    out: dict[str, list[CapacityPoint]] = defaultdict(list)
    for row in sums:
        # busy / 100 sample-percent -> busy samples; x interval / step -> GPU-equivalents
        used = (row["busy"] or 0.0) / 100 * interval / step
        out[row["cluster"]].append(CapacityPoint(row["start"], row["held"] / step, used))
    return dict(out)
