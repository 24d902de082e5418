"""Reads on clusters: each cluster with its inventory and use (nodes, GPUs, GPUs allocated),
and which viewers see them. A node without a cluster (inserted by the daemon of the release
before clusters) counts as the home cluster's."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from typing import Any

from django.db.models import Count, Q, QuerySet, Sum

from scheduler.models import Cluster, GpuDevice, Node
from tenants import access
from tenants.models import Role


def cluster_labels() -> dict[str, dict[str, str]]:
    """Every cluster's labels by name: what a job's placement names clusters by
    (`scheduler.core.clusters.resolve_placement`)."""
    rows = Cluster.objects.order_by("name").values_list("name", "labels")
    return {name: dict(labels or {}) for name, labels in rows}


@dataclass(frozen=True)
class ClusterUse:
    nodes: int = 0
    nodes_ready: int = 0
    gpus: int = 0
    gpus_allocated_milli: int = 0

    @property
    def utilization(self) -> float | None:
        """GPUs allocated over GPUs, None without GPUs."""
        return self.gpus_allocated_milli / (1000 * self.gpus) if self.gpus else None

    @property
    def percent(self) -> int | None:
        """The utilization in whole percent, for pages."""
        use = self.utilization
        return None if use is None else round(100 * use)


def cluster_names() -> list[str]:
    return list(Cluster.objects.order_by("name").values_list("name", flat=True))


def may_read_clusters(user: Any) -> bool:
    """As the node inventory: platform admins, finance and tenant admins."""
    grants = access.grants_for(user)
    return grants.sees_everything or Role.ADMIN in grants.roles_by_path.values()


def cluster_list_visible(user: Any) -> QuerySet[Cluster]:
    return Cluster.objects.order_by("name") if may_read_clusters(user) else Cluster.objects.none()


def cluster_use() -> dict[int, ClusterUse]:
    """Cluster id -> its present nodes and their GPUs, in three queries whatever the count."""
    home = Cluster.objects.filter(home=True).values_list("id", flat=True).first()
    counts: dict[int, list[int]] = defaultdict(lambda: [0, 0, 0, 0])
    nodes = (
        Node.objects.filter(present=True)
        .values_list("cluster_id")
        .annotate(n=Count("id"), ready=Count("id", filter=Q(ready=True)))
    )
    for cluster, n, ready in nodes:
        row = counts[cluster or home or 0]
        row[0], row[1] = row[0] + n, row[1] + ready
    gpus = (
        GpuDevice.objects.filter(node__present=True)
        .values_list("node__cluster_id")
        .annotate(n=Count("id"), milli=Sum("allocated_milli"))
    )
    for cluster, n, milli in gpus:
        row = counts[cluster or home or 0]
        row[2], row[3] = row[2] + n, row[3] + (milli or 0)
    return {key: ClusterUse(*row) for key, row in counts.items()}
