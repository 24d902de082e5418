"""Reads on nodes for platform admins: the inventory with its health and free GPUs, and what
runs on one node. Nodes hold no tenant data, but what runs there does: callers check that
the viewer is a platform admin before calling these."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.db.models import (
    Count,
    Exists,
    IntegerField,
    Max,
    OuterRef,
    Prefetch,
    Q,
    QuerySet,
    Subquery,
    Sum,
)
from django.db.models.functions import Coalesce
from django.http import Http404

from scheduler.agent.xids import xid_meaning
from scheduler.core.units import LABEL_NVLINK_DOMAIN
from scheduler.models import Allocation, AllocationDevice, Cluster, GpuDevice, Node, XidEvent
from tenants import access

# GPU Feature Discovery's labels for the MIG layout of a node: the strategy (none, single,
# mixed) and the mig-parted configuration applied. Gantry keeps node labels, not MIG counts.
LABEL_MIG_STRATEGY = "nvidia.com/mig.strategy"
LABEL_MIG_CONFIG = "nvidia.com/mig.config"

HEALTHY, UNHEALTHY, NOT_READY = "healthy", "unhealthy", "not ready"
HEALTH_CHOICES = [(HEALTHY, "Healthy"), (UNHEALTHY, "GPU unhealthy"), (NOT_READY, "Not ready")]
XID_HISTORY_ROWS = 50  # the node page's and the node API's latest XIDs


def _not_ready_q() -> Q:
    return Q(ready=False) | Q(sim_failed=True) | Q(present=False)


def xids_since(since: datetime) -> Any:
    """The node's XIDs seen since `since` (each row's coalesced `count`), as a subquery to
    annotate nodes with (a join would multiply the device counts beside it)."""
    recent = XidEvent.objects.filter(node=OuterRef("pk"), seen_at__gte=since)
    count = recent.order_by().values("node").annotate(n=Sum("count")).values("n")
    return Coalesce(Subquery(count, output_field=IntegerField()), 0)


def node_list_inventory(
    *,
    pool: str = "",
    health: str = "",
    model: str = "",
    cordoned: bool | None = None,
    xids_from: datetime | None = None,
    cluster: str = "",
) -> QuerySet[Node]:
    """Nodes by name with `gpus`, `gpus_unhealthy`, `gpus_free` (healthy devices nobody holds
    any share of), `allocated_milli`, `gpu_memory_mib` (per device) and, with `xids_from`,
    `xids_recent` (XIDs seen since then) annotated: one query per page, whatever the size."""
    nodes = Node.objects.annotate(
        gpus=Count("devices"),
        gpus_unhealthy=Count("devices", filter=Q(devices__healthy=False)),
        gpus_free=Count("devices", filter=Q(devices__healthy=True, devices__allocated_milli=0)),
        allocated_milli=Coalesce(Sum("devices__allocated_milli"), 0),
        gpu_memory_mib=Max("devices__memory_mib"),
    ).order_by("name")
    if xids_from is not None:
        nodes = nodes.annotate(xids_recent=xids_since(xids_from))
    if pool:
        nodes = nodes.filter(pool=pool)
    if model:
        nodes = nodes.filter(flavor=model)
    if cluster:  # a node without a cluster is the home cluster's
        home = Exists(Cluster.objects.filter(name=cluster, home=True))
        nodes = nodes.filter(Q(cluster__name=cluster) | (Q(cluster__isnull=True) & home))
    if cordoned is not None:
        nodes = (
            nodes.filter(Q(cordoned=True) | Q(cluster_unschedulable=True))
            if cordoned
            else (nodes.filter(cordoned=False, cluster_unschedulable=False))
        )
    if health == NOT_READY:
        nodes = nodes.filter(_not_ready_q())
    elif health == UNHEALTHY:
        nodes = nodes.exclude(_not_ready_q()).filter(gpus_unhealthy__gt=0)
    elif health == HEALTHY:
        nodes = nodes.exclude(_not_ready_q()).filter(gpus_unhealthy=0)
    return nodes


def node_health(node: Node, gpus_unhealthy: int) -> str:
    if not node.ready or node.sim_failed or not node.present:
        return NOT_READY
    return UNHEALTHY if gpus_unhealthy else HEALTHY


def node_mig_layout(node: Node) -> str:
    """The MIG layout as GPU Feature Discovery labels it ("" when not labelled)."""
    strategy = node.labels.get(LABEL_MIG_STRATEGY, "")
    if strategy == "none":
        return "off"
    config = node.labels.get(LABEL_MIG_CONFIG, "")
    return " / ".join(part for part in (strategy, config) if part)


def node_nvlink_domain(node: Node) -> str:
    return str(node.labels.get(LABEL_NVLINK_DOMAIN, ""))


def node_filter_choices() -> tuple[list[str], list[str]]:
    """(pools, GPU models) present in the inventory, for the filters."""
    pools = Node.objects.order_by("pool").values_list("pool", flat=True).distinct()
    models = Node.objects.exclude(flavor="").order_by("flavor").values_list("flavor", flat=True)
    return list(pools), list(models.distinct())


@dataclass(frozen=True)
class NodeDetail:
    node: Node
    devices: list[GpuDevice]
    allocations: list[Allocation]  # live, with job, tenant and their device shares prefetched
    health: str
    xids: list[XidEvent]  # the latest XID_HISTORY_ROWS, newest first, each with `meaning`


def access_node(user: Any, node_id: Any) -> Node:
    """The node for a platform admin; 404 for everyone else and for unknown ids alike (the
    inventory and what runs there are the platform admins' alone in the portal)."""
    if not access.grants_for(user).platform_admin:
        raise Http404("Not found.")
    try:
        return Node.objects.get(pk=int(node_id))
    except (ValueError, TypeError, Node.DoesNotExist):
        raise Http404("Not found.") from None


def node_detail_data(node: Node) -> NodeDetail:
    """The node's devices, its live allocations (job, tenant, the devices and share each
    holds) and its latest XIDs: four queries."""
    devices = list(GpuDevice.objects.filter(node=node).order_by("index"))
    shares = AllocationDevice.objects.filter(released=False).select_related("device")
    allocations = list(
        Allocation.objects.filter(node=node, ended_at__isnull=True)
        .select_related("job__tenant", "job__project")
        .prefetch_related(Prefetch("devices", queryset=shares.order_by("device__index")))
        .order_by("job_id", "replica")
    )
    sick = sum(not d.healthy for d in devices)
    return NodeDetail(node, devices, allocations, node_health(node, sick), node_xid_history(node))


def node_xid_history(node: Node, limit: int = XID_HISTORY_ROWS) -> list[XidEvent]:
    """The node's latest XIDs, newest first, with their device and `meaning` (the catalogue's
    words for the known codes, "" for others): one query."""
    latest = XidEvent.objects.filter(node=node).select_related("device").order_by("-seen_at", "-id")
    events = list(latest[:limit])
    for event in events:
        event.meaning = xid_meaning(event.code)  # type: ignore[attr-defined]
    return events
