"""The daemon's node duties, each cycle before reconcile: sync the inventory, apply admin
requests (simulated failures, cordons, drains), cordon what is unhealthy and lift its own
cordons once healed; and scale inference jobs on the backend's load signal.
"""

from __future__ import annotations

import logging
import math
from typing import TYPE_CHECKING, Any

from django.db import connection, transaction
from django.db.models import Q
from django.db.models.functions import Now

from scheduler.backends.base import NodeInfo
from scheduler.lifecycle import HOLDING_STATES
from scheduler.models import Allocation, AllocationDevice, GpuDevice, Job, JobState, Node
from scheduler.nodes import DAEMON, node_sync
from scheduler.transitions import Change, transition_many

if TYPE_CHECKING:
    from scheduler.daemon import Daemon

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


def sync_nodes(daemon: Daemon, *, force: bool = False) -> int:
    """Write the inventory when the cluster's view changed (or `force`); apply admin
    requests. Returns how many nodes changed."""
    _apply_sim_failures(daemon)
    infos = list(daemon.backend.list_nodes())
    prints = {i.name: _fingerprint(i) for i in infos}
    changed = force or prints != daemon.node_prints
    if changed:
        with transaction.atomic():
            daemon.lease.fence()
            node_sync(infos)
        daemon.node_prints = prints
    _health(daemon, {i.name: i for i in infos})
    return int(changed)


def _apply_sim_failures(daemon: Daemon) -> None:
    fail, heal = (
        getattr(daemon.backend, "fail_node", None),
        getattr(daemon.backend, "heal_node", None),
    )
    failed_now = getattr(daemon.backend, "node_failed", None)
    if fail is None or heal is None or failed_now is None:
        return
    for name, wanted in Node.objects.filter(Q(sim_failed=True) | Q(ready=False)).values_list(
        "name", "sim_failed"
    ):
        if wanted and not failed_now(name):
            log.info("failing node %s as an admin asked", name)
            daemon.fence_cluster_write()
            fail(name, "failed by an admin (simulated)")
        elif not wanted and failed_now(name):
            daemon.fence_cluster_write()
            heal(name)


def _health(daemon: Daemon, infos: dict[str, NodeInfo]) -> None:
    nodes = list(
        Node.objects.filter(
            Q(ready=False) | Q(cordoned=True) | Q(drain_requested=True) | Q(devices__healthy=False)
        ).distinct()
    )
    sick = dict(GpuDevice.objects.filter(healthy=False).values_list("node_id", "index"))
    with transaction.atomic():
        daemon.lease.fence()
        for node in nodes:
            _judge_node(daemon, node, sick, infos.get(node.name))
    _mirror_cordons(daemon, infos)


def _mirror_cordons(daemon: Daemon, infos: dict[str, NodeInfo]) -> None:
    """Gantry's cordons go to the cluster. A node the cluster's own admins cordoned is left
    alone: the daemon uncordons in the cluster only what it cordoned there itself."""
    cordoned = set(Node.objects.filter(cordoned=True).values_list("name", flat=True))
    for name, info in infos.items():
        if name in cordoned and not info.unschedulable:
            daemon.fence_cluster_write()
            daemon.backend.set_node_unschedulable(name, True)
            daemon.cluster_cordons.add(name)
        elif name not in cordoned and info.unschedulable and name in daemon.cluster_cordons:
            daemon.fence_cluster_write()
            daemon.backend.set_node_unschedulable(name, False)
            daemon.cluster_cordons.discard(name)


def _judge_node(daemon: Daemon, node: Node, sick: dict[int, int], info: NodeInfo | None) -> None:
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
        _drain(daemon, node)


def _drain(daemon: Daemon, node: Node) -> None:
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
    result = transition_many(
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
        daemon.now_dt(),
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


def autoscale(daemon: Daemon) -> int:
    """Set each running inference job's replica target from the backend's load signal,
    between its min and max replicas. Growth is placed by the engine (within quota, as
    preemptible elastic replicas); shrinking stops the highest replicas first."""
    load = getattr(daemon.backend, "inference_load", None)
    if load is None:
        return 0
    rows = Job.objects.filter(job_type="inference", state=S.RUNNING).values(
        "id", "replicas", "spec"
    )
    targets = {}
    for row in rows:
        low = row["spec"].get("min_replicas") or row["replicas"]
        high = row["spec"].get("max_replicas") or low
        want = max(low, min(high, math.ceil(load(row["id"]))))
        if want != row["replicas"]:
            targets[row["id"]] = want
    if not targets:
        return 0
    with transaction.atomic():
        daemon.lease.fence()
        for job_id, want in targets.items():
            Job.objects.filter(id=job_id, state=S.RUNNING).update(replicas=want)
            Allocation.objects.filter(
                job_id=job_id, replica__gte=want, ended_at__isnull=True, end_reason=""
            ).update(end_reason="scaled down")
    log.info("inference targets: %s", targets)
    return len(targets)


# The tables the daemon plans against every cycle, and the columns its statements filter
# and join on: analysing these alone takes a tenth of the time (the jobs' JSON specs are
# most of an ANALYZE of their table: 128 ms at 15,000 jobs).
PLANNED_COLUMNS = {
    Job._meta.db_table: ("id", "state", "tenant_id", "priority_class_id", "queued_at"),
    Allocation._meta.db_table: ("id", "job_id", "node_id", "ended_at"),
    AllocationDevice._meta.db_table: ("id", "allocation_id", "device_id", "released"),
}
STATISTICS_EVERY_S = 10.0


def refresh_statistics(daemon: Daemon) -> list[str]:
    """ANALYZE, on PostgreSQL, the columns the daemon plans with (`PLANNED_COLUMNS`) of each
    table that changed by more rows than it held when last analysed (and by at least
    1,000); looked at every `STATISTICS_EVERY_S` on the daemon's clock. Autovacuum does the
    same after its naptime (a minute) and a tenth of the table: a new installation under
    load is planned blind until then, and the planner scans whole tables to update a
    hundred rows. An ANALYZE of some columns does not reset PostgreSQL's count of changes,
    so the daemon keeps the count it analysed at (`Daemon.analysed`). Returns the tables
    analysed."""
    now = daemon.clock()
    if connection.vendor != "postgresql" or now - daemon.statistics_at < STATISTICS_EVERY_S:
        return []
    daemon.statistics_at = now
    stale = []
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT s.relname, s.n_mod_since_analyze, s.n_live_tup, c.reltuples"
            " FROM pg_stat_user_tables s JOIN pg_class c ON c.oid = s.relid"
            " WHERE s.relname = ANY(%s) ORDER BY s.relname",
            [list(PLANNED_COLUMNS)],
        )
        for table, changed, rows, reltuples in cursor.fetchall():
            changed_then, held = daemon.analysed.get(table, (0, max(0, int(reltuples))))
            if changed - changed_then <= max(1000, held):
                continue  # also when autovacuum analysed it since (the count went down)
            columns = ", ".join(map(connection.ops.quote_name, PLANNED_COLUMNS[table]))
            cursor.execute(f"ANALYZE {connection.ops.quote_name(table)} ({columns})")
            daemon.analysed[table] = (changed, rows)
            stale.append(table)
    if stale:
        log.info("analysed %s", ", ".join(stale))
    return stale
