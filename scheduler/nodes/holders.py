"""Who holds each GPU of a node now: the pods the node agent labels its exported series with.

Read when an agent reports (`POST /api/v1/nodes/report/` answers with it), so the agent
learns its node's allocations without a request of its own; the report's caller is that
node's agent or a platform admin, who may both know what runs there.
"""

from __future__ import annotations

from typing import Any

from django.db.models import F

from scheduler.models import AllocationDevice, Node


def node_device_holders(node: Node) -> list[dict[str, Any]]:
    """One row per active share of a device of `node` (index, pod, namespace, milli), by
    device index then pod name. One query."""
    rows = (
        AllocationDevice.objects.filter(
            allocation__node=node, allocation__ended_at__isnull=True, released=False
        )
        .order_by("device__index", "allocation__pod_name")
        .values(
            "milli",
            index=F("device__index"),
            pod=F("allocation__pod_name"),
            namespace=F("allocation__namespace"),
        )
    )
    return [dict(row) for row in rows]
