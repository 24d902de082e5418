"""A node agent's XIDs as history rows, bounded (scheduler.nodes.services.gpu_report calls it).

A report may name 64 codes on each of 64 GPUs, every second: written as they come, one node in
an XID storm would add 4,096 rows a second. So:
1. a (GPU, code) that already has a row seen within GANTRY_XID_COALESCE_S adds one to that
   row's `count` instead of a new row;
2. new rows are at most GANTRY_XID_ROWS_PER_MINUTE per node in the trailing minute (the report
   included), fatal codes first, then by GPU and code; the rest are left out of the history
   and logged. The device's health does not depend on them: gpu_report judges every reported
   code (`_verdict`), kept or not.
The caller holds the node's devices locked (select_for_update), so two reports of one node
never interleave here.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db.models import F

from scheduler.agent.xids import FATAL_XIDS
from scheduler.models import GpuDevice, XidEvent

log = logging.getLogger("gantry.nodes")
MINUTE = timedelta(minutes=1)


@dataclass(frozen=True)
class XidIngest:
    created: int  # new rows
    coalesced: int  # repeats added to a row's count
    dropped: int  # over the node's minute budget: not in the history


def _reported(
    devices: Mapping[int, GpuDevice], gpus: Sequence[Mapping[str, Any]]
) -> dict[tuple[int, int], tuple[GpuDevice, str]]:
    """(device id, code) -> (device, uuid as reported), once per pair."""
    pairs: dict[tuple[int, int], tuple[GpuDevice, str]] = {}
    for gpu in gpus:
        device = devices[gpu["index"]]
        for code in gpu.get("xid_errors") or ():
            pairs.setdefault((device.id, code), (device, gpu.get("uuid") or device.uuid))
    return pairs


def xids_record(
    node_id: int,
    devices: Mapping[int, GpuDevice],
    gpus: Sequence[Mapping[str, Any]],
    now: datetime,
) -> XidIngest:
    """Record the report's XIDs for node `node_id` (module docstring)."""
    reported = _reported(devices, gpus)
    if not reported:
        return XidIngest(0, 0, 0)
    # 1. coalesce into the latest row of each pair within the window
    window = now - timedelta(seconds=settings.GANTRY_XID_COALESCE_S)
    recent = XidEvent.objects.filter(
        node_id=node_id,
        seen_at__gte=window,
        seen_at__lte=now,
        device_id__in={device_id for device_id, _ in reported},
        code__in={code for _, code in reported},
    ).order_by("seen_at", "id")
    latest = {(row.device_id, row.code): row.id for row in recent.only("id", "device_id", "code")}
    open_rows = [row for pair, row in latest.items() if pair in reported]
    XidEvent.objects.filter(id__in=open_rows).update(count=F("count") + 1)
    # 2. new rows within the node's minute budget, fatal first
    fresh = sorted(
        (pair for pair in reported if pair not in latest),
        key=lambda pair: (pair[1] not in FATAL_XIDS, reported[pair][0].index, pair[1]),
    )
    written = XidEvent.objects.filter(node_id=node_id, seen_at__gt=now - MINUTE).count()
    budget = max(settings.GANTRY_XID_ROWS_PER_MINUTE - written, 0)
    kept = fresh[:budget]
    XidEvent.objects.bulk_create(
        XidEvent(
            node_id=node_id,
            device=reported[pair][0],
            uuid=reported[pair][1],
            code=pair[1],
            fatal=pair[1] in FATAL_XIDS,
            seen_at=now,
        )
        for pair in kept
    )
    dropped = len(fresh) - len(kept)
    if dropped:
        log.warning(
            "node %s: %d XIDs left out of the history (more than %d new rows in a minute)",
            node_id,
            dropped,
            settings.GANTRY_XID_ROWS_PER_MINUTE,
        )
    return XidIngest(len(kept), len(open_rows), dropped)
