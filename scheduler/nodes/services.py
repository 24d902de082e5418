"""Node services: inventory sync from the cluster backend, admin cordon/drain/uncordon,
simulated failures, and the node agent's GPU health reports.

Admins only record what they want (`cordoned`, `drain_requested`, `sim_failed`); the daemon,
the only process that talks to the cluster, applies it on its next cycle.
"""

from __future__ import annotations

import importlib
import logging
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.core.exceptions import PermissionDenied, ValidationError
from django.db import transaction
from django.utils import timezone

from common.errors import ConflictError
from scheduler.agent.xids import FATAL_XIDS
from scheduler.backends.base import NodeInfo
from scheduler.core.clusters import CLUSTER_LABEL
from scheduler.models import Cluster, GpuDevice, Node, NodeAgent
from scheduler.nodes.xids import xids_record
from scheduler.telemetry.samples import DeviceReading, samples_ingest
from tenants import access

log = logging.getLogger("gantry.nodes")

DAEMON = "daemon"
ADMIN = "admin"


def _audit(**kwargs: Any) -> None:
    """Record in the audit log when the tenants app provides one."""
    try:
        module = importlib.import_module("tenants.audit")
    except ImportError:  # pragma: no cover - the audit app is optional here
        log.info("node action %s by %s", kwargs.get("action"), kwargs.get("actor"))
        return
    module.audit_record(tenant=None, **kwargs)


# --- inventory ------


@dataclass
class SyncResult:
    created: int = 0
    updated: int = 0
    vanished: int = 0


@dataclass(frozen=True)
class ClusterIds:
    """Which Cluster row a listed node belongs to: its `gantry.io/cluster` label's, else the
    home cluster's (a single backend lists its nodes unlabelled)."""

    by_name: dict[str, int]
    home: int | None

    @classmethod
    def load(cls) -> ClusterIds:
        rows = list(Cluster.objects.values_list("name", "id", "home"))
        home = next((pk for _, pk, is_home in rows if is_home), None)
        return cls({name: pk for name, pk, _ in rows}, home)

    def of(self, info: NodeInfo) -> int | None:
        return self.by_name.get(info.labels.get(CLUSTER_LABEL, ""), self.home)


def _node_fields(info: NodeInfo, clusters: ClusterIds) -> dict[str, Any]:
    return {
        "cluster_id": clusters.of(info),
        "flavor": info.flavor,
        "pool": info.labels.get("gantry.io/pool", "default"),
        "cpu_milli": info.cpu_milli,
        "memory_mib": info.memory_mib,
        "rdma": info.rdma,
        "labels": dict(info.labels),
        "taints": [list(t) for t in info.taints],
        "ready": info.ready,
        "cluster_unschedulable": info.unschedulable,
        "present": True,
    }


@transaction.atomic
def node_sync(infos: Sequence[NodeInfo], *, complete: bool = True) -> SyncResult:
    """Upsert `infos` (nodes and their devices). With `complete`, nodes the cluster no longer
    lists are marked absent and not ready. Bounded queries whatever the node count."""
    result = SyncResult()
    now = timezone.now()
    clusters = ClusterIds.load()
    existing = {n.name: n for n in Node.objects.all()}
    new = [Node(name=i.name, **_node_fields(i, clusters)) for i in infos if i.name not in existing]
    Node.objects.bulk_create(new, batch_size=2000)
    result.created = len(new)
    changed = []
    for info in infos:
        node = existing.get(info.name)
        fields = _node_fields(info, clusters)
        if node is not None and any(getattr(node, k) != v for k, v in fields.items()):
            for key, value in fields.items():
                setattr(node, key, value)
            node.updated_at = now
            changed.append(node)
    if complete:
        listed = {i.name for i in infos}
        for name, node in existing.items():
            if name not in listed and node.present:
                node.present, node.ready, node.updated_at = False, False, now
                changed.append(node)
                result.vanished += 1
    Node.objects.bulk_update(
        changed,
        [*_node_fields(infos[0], clusters).keys(), "updated_at"]
        if infos
        else ["present", "ready", "updated_at"],
        batch_size=2000,
    )
    result.updated = len(changed) - result.vanished
    _sync_devices(infos)
    return result


def _sync_devices(infos: Iterable[NodeInfo]) -> None:
    ids = dict(Node.objects.values_list("name", "id"))
    have = {(d.node_id, d.index): d for d in GpuDevice.objects.filter(node_id__in=ids.values())}
    new, changed = [], []
    for info in infos:
        node_id = ids[info.name]
        for gpu in info.gpus:
            device = have.get((node_id, gpu.index))
            if device is None:
                new.append(
                    GpuDevice(
                        node_id=node_id,
                        index=gpu.index,
                        uuid=gpu.uuid,
                        model=info.flavor,
                        memory_mib=gpu.memory_mib,
                        healthy=gpu.healthy,
                    )
                )
            elif device.memory_mib != gpu.memory_mib or (not gpu.healthy and device.healthy):
                device.memory_mib = gpu.memory_mib
                if not gpu.healthy:
                    device.healthy, device.health_reason = (
                        False,
                        "reported unhealthy by the cluster",
                    )
                changed.append(device)
    GpuDevice.objects.bulk_create(new, batch_size=5000)
    GpuDevice.objects.bulk_update(changed, ["memory_mib", "healthy", "health_reason"])
    _touch({d.node_id for d in changed})


def _touch(node_ids: Iterable[int]) -> None:
    """Bump `updated_at`: the daemon's cached inventory is keyed on it."""
    Node.objects.filter(id__in=list(node_ids)).update(updated_at=timezone.now())


# --- admin actions ------


def _require_platform_admin(user: Any) -> None:
    if not access.grants_for(user).platform_admin:
        raise PermissionDenied("Only platform admins manage nodes.")


def _change(user: Any, node: Node, action: str, **fields: Any) -> Node:
    _require_platform_admin(user)
    with transaction.atomic():
        locked = Node.objects.select_for_update().get(pk=node.pk)
        before = {k: getattr(locked, k) for k in fields}
        for key, value in fields.items():
            setattr(locked, key, value)
        locked.save(update_fields=[*fields, "updated_at"])
        _audit(actor=user, action=action, target=locked, before=before, after=fields)
    return locked


def node_cordon(*, user: Any, node: Node, reason: str = "") -> Node:
    """No new placements on `node`; what runs there keeps running."""
    text = reason or f"cordoned by {user.get_username()}"
    return _change(
        user, node, "node.cordon", cordoned=True, cordoned_by=ADMIN, cordon_reason=text[:300]
    )


def node_drain(*, user: Any, node: Node, reason: str = "") -> Node:
    """Cordon, and have the daemon stop every job on the node (requeued per their policy)."""
    text = reason or f"drained by {user.get_username()}"
    return _change(
        user,
        node,
        "node.drain",
        cordoned=True,
        cordoned_by=ADMIN,
        cordon_reason=text[:300],
        drain_requested=True,
    )


def node_uncordon(*, user: Any, node: Node) -> Node:
    if not node.ready:
        raise ConflictError(
            f"Node {node.name} is NotReady; it cannot be uncordoned until it heals."
        )
    return _change(
        user,
        node,
        "node.uncordon",
        cordoned=False,
        cordoned_by="",
        cordon_reason="",
        drain_requested=False,
    )


def node_set_failed(*, user: Any, node: Node, failed: bool) -> Node:
    """Simulated cluster only: fail or heal the node (the daemon applies it)."""
    return _change(user, node, "node.fail" if failed else "node.heal", sim_failed=failed)


# --- GPU health reports --------------------------------------------------------------------------


def can_report(user: Any) -> bool:
    """Platform admins, and the agent accounts of `manage.py node_agent_token` (for their node:
    `require_reporter`)."""
    return bool(access.grants_for(user).platform_admin or _agent_node(user) is not None)


def _agent_node(user: Any) -> str | None:
    if not getattr(user, "is_authenticated", False):
        return None
    return NodeAgent.objects.filter(user_id=user.pk).values_list("node_name", flat=True).first()


def require_reporter(user: Any, node_name: str) -> None:
    """PermissionDenied unless `user` may report for `node_name`: a platform admin for any
    node, a node agent for its own."""
    if access.grants_for(user).platform_admin:
        return
    own = _agent_node(user)
    if own is None:
        raise PermissionDenied("Only node agents and platform admins post GPU reports.")
    if own != node_name:
        raise PermissionDenied(
            f"This agent reports for node {own[:64]!r} only, not {node_name[:64]!r}."
        )


def _check_inventory(node: Node, devices: dict[int, GpuDevice], gpus: list[dict[str, Any]]) -> None:
    """Readings only for the devices the cluster lists: an agent never invents a device."""
    unknown = sorted({gpu["index"] for gpu in gpus} - set(devices))
    if unknown:
        listed = ", ".join(map(str, sorted(devices))) or "none"
        raise ValidationError(
            {
                "gpus": [
                    f"GPU index {', '.join(map(str, unknown[:8]))} is not in node "
                    f"{node.name}'s inventory (the cluster lists: {listed})."
                ]
            }
        )


def _verdict(gpu: dict[str, Any]) -> tuple[bool, str]:
    fatal = sorted(set(gpu.get("xid_errors") or []) & FATAL_XIDS)
    if fatal:
        return False, f"XID {', '.join(map(str, fatal))}"
    if gpu.get("ecc_uncorrected", 0) > 0:
        return False, f"{gpu['ecc_uncorrected']} uncorrected ECC errors"
    if not gpu.get("healthy", True):
        return False, "reported unhealthy by the node agent"
    return True, ""


def _samples_due(
    devices: dict[int, GpuDevice], gpus: list[dict[str, Any]], now: datetime
) -> list[DeviceReading]:
    """The report's readings as utilization samples, except for devices read less than half
    a sampling interval ago: a burst of reports (an agent restarting in a loop, a retry
    storm) does not multiply the history. Nor for a device last read after `now` (another
    web server whose clock is ahead): the history stays in time order."""
    spacing = timedelta(seconds=settings.GANTRY_UTILIZATION_SAMPLE_S / 2)
    readings = []
    for gpu in gpus:
        device = devices[gpu["index"]]
        if device.reported_at is not None and device.reported_at > now - spacing:
            continue
        readings.append(
            DeviceReading(
                device_id=device.id,
                utilization_pct=gpu["utilization_pct"],
                memory_used_mib=gpu["memory_used_mib"],
                power_w=gpu.get("power_w"),
                temperature_c=gpu["temperature_c"],
                sm_active_pct=gpu.get("sm_active_pct"),
            )
        )
    return readings


@transaction.atomic
def gpu_report(*, user: Any, node: Node, driver_version: str, gpus: list[dict[str, Any]]) -> Node:
    """Record the node agent's readings of the node's listed devices (an unknown index is a
    ValidationError and nothing is written). A device turns unhealthy on a fatal XID, an
    uncorrected ECC error or the agent's own verdict, and stays so until an admin heals it
    (a healthy reading does not clear it: XIDs are one-off events). The readings are also
    kept as utilization samples (one insert for the report; `_samples_due`), and the XIDs as
    the devices' XID history, bounded and coalesced (scheduler/nodes/xids.py)."""
    require_reporter(user, node.name)
    now = timezone.now()
    devices = {d.index: d for d in GpuDevice.objects.select_for_update().filter(node=node)}
    _check_inventory(node, devices, gpus)
    sick_before = sum(not d.healthy for d in devices.values())
    readings = _samples_due(devices, gpus, now)
    for gpu in gpus:
        device = devices[gpu["index"]]
        healthy, reason = _verdict(gpu)
        # What the device is (model, memory) stays as the cluster lists it: placement reads it.
        device.uuid = device.uuid or gpu["uuid"]
        device.memory_used_mib = gpu["memory_used_mib"]
        device.utilization_pct, device.temperature_c = gpu["utilization_pct"], gpu["temperature_c"]
        device.ecc_uncorrected, device.xid_errors = gpu["ecc_uncorrected"], gpu["xid_errors"]
        device.reported_at = now
        if not healthy:
            device.healthy, device.health_reason = False, reason
        device.save()
    samples_ingest(readings, at=now, flavors={d.id: d.model for d in devices.values()})
    xids_record(node.pk, devices, gpus, now)
    Node.objects.filter(pk=node.pk).update(driver_version=driver_version, last_report_at=now)
    if GpuDevice.objects.filter(node=node, healthy=False).count() != sick_before:
        _touch([node.pk])
    node.refresh_from_db()
    return node


def node_heal(*, user: Any, node: Node) -> Node:
    """Heal the node (simulated cluster: it reports Ready again) and declare its GPUs healthy,
    in one transaction: the API and the portal's Heal button both come here."""
    with transaction.atomic():
        node = node_set_failed(user=user, node=node, failed=False)
        return gpu_heal(user=user, node=node)


def gpu_heal(*, user: Any, node: Node) -> Node:
    """An admin declares the node's devices healthy again (after a reset or replacement)."""
    _require_platform_admin(user)
    with transaction.atomic():
        GpuDevice.objects.filter(node=node).update(healthy=True, health_reason="")
        _touch([node.pk])
        _audit(actor=user, action="node.gpu_heal", target=node, before=None, after=None)
    return node
