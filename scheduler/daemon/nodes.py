"""The daemon's node duties, each cycle before reconcile: sync the inventory, apply admin
requests (simulated failures, cordons, drains), cordon what is unhealthy and lift its own
cordons once healed.
"""

from __future__ import annotations

import logging
from typing import Any

from django.db.models import Q
from django.db.models.functions import Now

from scheduler.backends.base import FaultInjection, NodeInfo
from scheduler.daemon.cluster import Cluster
from scheduler.daemon.state import Clock, NodeMemory
from scheduler.jobs.lifecycle import HOLDING_STATES
from scheduler.jobs.transitions import Change, transition
from scheduler.leader import Lease
from scheduler.models import Allocation, GpuDevice, Job, JobState, Node
from scheduler.nodes.services import DAEMON, node_sync

log = logging.getLogger("gantry.daemon")
S = JobState


def _fingerprint(info: NodeInfo) -> tuple[Any, ...]:
    gpus = tuple((g.index, g.memory_mib, g.healthy) for g in info.gpus)
    return (
        info.flavor,
        gpus,
        info.cpu_milli,
        info.memory_mib,
        info.ready,
        info.unschedulable,
        tuple(sorted(info.labels.items())),
        info.taints,
    )


def _prints(infos: list[NodeInfo], memory: NodeMemory) -> dict[str, tuple[Any, ...]]:
    """Each node's fingerprint; taken again only for a node listed as another object than
    last time (NodeInfo is frozen: a backend lists a changed node as a new one, and the
    simulated cluster an unchanged one as the same)."""
    seen = memory.listed
    prints = {}
    for info in infos:
        kept = seen.get(info.name)
        prints[info.name] = kept[1] if kept is not None and kept[0] is info else _fingerprint(info)
    memory.listed = {info.name: (info, prints[info.name]) for info in infos}
    return prints


def sync_nodes(
    cluster: Cluster, lease: Lease, memory: NodeMemory, clock: Clock, *, force: bool = False
) -> int:
    """Write the inventory when the cluster's view changed (or `force`); apply admin
    requests. Returns whether it wrote the inventory (1) or not (0)."""
    _apply_sim_failures(cluster)
    infos = list(cluster.backend.list_nodes())
    prints = _prints(infos, memory)
    changed = force or prints != memory.prints
    if changed:
        with lease.writing():
            node_sync(infos)
        memory.prints = prints
    _health(cluster, lease, memory, clock, {i.name: i for i in infos})
    return int(changed)


def _apply_sim_failures(cluster: Cluster) -> None:
    """An admin's simulated node failures and recoveries, on a backend that can fake them."""
    backend = cluster.backend
    if not isinstance(backend, FaultInjection):
        return
    for name, wanted in Node.objects.filter(Q(sim_failed=True) | Q(ready=False)).values_list(
        "name", "sim_failed"
    ):
        if wanted and not backend.node_failed(name):
            log.info("failing node %s as an admin asked", name)
            cluster.keeper.fence_cluster_write()
            backend.fail_node(name, "failed by an admin (simulated)")
        elif not wanted and backend.node_failed(name):
            cluster.keeper.fence_cluster_write()
            backend.heal_node(name)


def _health(
    cluster: Cluster, lease: Lease, memory: NodeMemory, clock: Clock, infos: dict[str, NodeInfo]
) -> None:
    nodes = list(
        Node.objects.filter(
            Q(ready=False) | Q(cordoned=True) | Q(drain_requested=True) | Q(devices__healthy=False)
        ).distinct()
    )
    sick = dict(GpuDevice.objects.filter(healthy=False).values_list("node_id", "index"))
    with lease.writing():
        for node in nodes:
            _judge_node(node, sick, clock)
    _mirror_cordons(cluster, memory, infos)


def _mirror_cordons(cluster: Cluster, memory: NodeMemory, infos: dict[str, NodeInfo]) -> None:
    """Gantry's cordons go to the cluster. A node the cluster's own admins cordoned is left
    alone: the daemon uncordons in the cluster only what it cordoned there itself."""
    cordoned = set(Node.objects.filter(cordoned=True).values_list("name", flat=True))
    for name, info in infos.items():
        if name in cordoned and not info.unschedulable:
            cluster.set_unschedulable(name, True)
            memory.cordons.add(name)
        elif name not in cordoned and info.unschedulable and name in memory.cordons:
            cluster.set_unschedulable(name, False)
            memory.cordons.discard(name)


def _judge_node(node: Node, sick: dict[int, int], clock: Clock) -> None:
    problem = ""
    if not node.ready or not node.present:
        problem = "NotReady" if node.present else "gone from the cluster"
    elif node.pk in sick:
        problem = f"GPU {sick[node.pk]} unhealthy"
    if problem and not node.cordoned:
        log.warning("cordoning node %s: %s", node.name, problem)
        Node.objects.filter(pk=node.pk).update(
            updated_at=Now(), cordoned=True, cordoned_by=DAEMON, cordon_reason=problem
        )
    elif not problem and node.cordoned and node.cordoned_by == DAEMON:
        log.info("node %s healthy again: uncordoning", node.name)
        Node.objects.filter(pk=node.pk).update(
            cordoned=False, cordoned_by="", cordon_reason="", updated_at=Now()
        )
    if node.drain_requested:
        _drain(node, clock)


def _drain(node: Node, clock: Clock) -> None:
    """Preempt every job holding devices on `node` (admitted, binding or running). The
    request is kept until none is left to move: a job whose row another session held
    locked is tried again at the next cycle; one that is already stopping or ended (or was
    requeued meanwhile) has nothing left to move."""
    jobs = set(
        Allocation.objects.filter(node=node, ended_at__isnull=True).values_list("job_id", flat=True)
    )
    holding = set(
        Job.objects.filter(id__any=list(jobs), state__in=HOLDING_STATES).values_list(
            "id", flat=True
        )
    )
    why = node.cordon_reason or "drained"
    result = transition(
        [
            Change(
                j,
                HOLDING_STATES,
                S.PREEMPTED,
                kind="preempted",
                message=f"Stopped: node {node.name} is being drained ({why}).",
                reason=f"node {node.name} drained",
            )
            for j in sorted(holding)
        ],
        clock.dt(),
    )
    left = result.busy | {j for j, state in result.moved.items() if state in HOLDING_STATES}
    if left:
        log.warning(
            "drain of node %s: job(s) %s could not be moved yet; retrying next cycle",
            node.name,
            ", ".join(map(str, sorted(left))),
        )
        return
    Node.objects.filter(pk=node.pk).update(drain_requested=False, updated_at=Now())
