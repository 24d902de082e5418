"""The snapshot: what the engine decides on, built in a fixed number of queries.

Building reads, in order: the versions of the inventory and the organisation
(nodes and devices, tenants, quotas and priority classes when they changed), the active
allocations, the versions of the jobs holding them, their rows, the device shares, recent
preemptions, the queue's versions and rows: a fixed number of queries whatever the size of
the cluster (tests/daemon/test_snapshot.py pins both counts, cold and warm).
`SnapshotCache` keeps what did not change between cycles; `scheduler.snapshot.translate` turns
rows into the engine's types.
"""

from __future__ import annotations

import functools
import json
import logging
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import timedelta
from typing import Any

from django.db import connection
from django.utils import timezone

from scheduler.clusters.selectors import cluster_labels
from scheduler.core.types import (
    DeviceShare,
    PriorityClass,
    Snapshot,
)
from scheduler.core.types import Node as CoreNode
from scheduler.core.types import Tenant as CoreTenant
from scheduler.models import (
    Allocation,
    AllocationDevice,
    Cluster,
    GpuDevice,
    JobEvent,
    JobState,
    Node,
)
from scheduler.snapshot.cache import SnapshotCache, _job_rows, rows_by_version, running_job_rows
from scheduler.snapshot.queue import _queue, queue_heads
from scheduler.snapshot.rows import aware
from scheduler.snapshot.translate import (
    core_job_id,
    load_nodes,
    load_tenants,
    priority_classes,
    running_jobs,
)
from tenants.models import PriorityClass as PriorityClassRow
from tenants.models import Quota as QuotaRow
from tenants.models import Tenant

log = logging.getLogger("gantry.daemon")
S = JobState


@dataclass
class Built:
    """A snapshot and the rows behind it, for the daemon to act on decisions."""

    snapshot: Snapshot
    jobs: dict[int, dict[str, Any]]  # job id -> its row (values), pending and running
    pending_ids: list[int]
    nodes: dict[str, int]  # node name -> id
    devices: dict[tuple[str, int], int]  # (node name, index) -> device id


def build_snapshot(
    now: float,
    *,
    decayed: Mapping[str, float],
    max_pending: int = 20_000,
    per_queue: int = 0,
    cache: SnapshotCache | None = None,
    active: Sequence[Mapping[str, Any]] | None = None,
    running_rows: Mapping[int, dict[str, Any]] | None = None,
) -> Built:
    """`max_pending` bounds the queue the engine sees (by priority, then age); `per_queue`,
    when set, keeps only the first jobs of each tenant x priority class (kueue's queue heads):
    a job behind `per_queue` others of its own queue could not start before them anyway.
    `active`: the active allocations when the caller has just read them (the daemon's
    reconcile), with at least the fields read here; otherwise they are read. `running_rows`:
    likewise, the rows of the jobs holding them (job id -> row, as `running_job_rows` reads
    them), current after the caller's own writes."""
    cache = cache if cache is not None else SnapshotCache()
    versions = _versions()
    nodes, devices, node_ids = _nodes(versions[0] if versions else None, cache)
    org = _organisation(versions[1] if versions else None, cache)
    tenants, slugs, classes, core_classes, clusters = org
    # Every active allocation holds its devices, whatever its job's state: a job requeued
    # or ended keeps its GPUs until its pods are really gone (so it is not pending either:
    # the engine skips queued jobs that are live).
    allocations = (
        list(active)
        if active is not None
        else list(
            Allocation.objects.filter(ended_at__isnull=True).values(
                "id", "job_id", "replica", "node__name", "flavor", "elastic", "started_at"
            )
        )
    )
    if running_rows is None:
        running_rows = {r["id"]: r for r in running_job_rows(cache)}
    shares = _shares([a["id"] for a in allocations], cache)
    running = running_jobs(
        allocations,
        shares,
        running_rows,
        _displaced(cache),
        lambda row: cache.request(row, slugs, classes, clusters),
        cache.running,
    )
    if per_queue and connection.vendor == "postgresql":
        window = rows_by_version(queue_heads(max_pending, per_queue, cache.queues_seen), cache)
    else:
        queue = ("queue", max_pending, per_queue)
        window = _job_rows(queue, lambda: _queue(max_pending, per_queue), cache)
    pending_rows = [r for r in window if r["state"] == S.QUEUED]
    pending_rows.sort(
        key=lambda r: (-classes[r["priority_class_id"]]["value"], r["queued_at"], r["id"])
    )
    seen = running_rows.keys() | {r["id"] for r in pending_rows}
    for gone in [i for i in cache.rows if i not in seen]:
        del cache.rows[gone]
    for gone in [i for i in cache.requests if i not in seen]:
        del cache.requests[gone]
    pending = tuple(cache.request(r, slugs, classes, clusters) for r in pending_rows)
    snapshot = Snapshot(
        now=now,
        nodes=tuple(nodes.values()),
        tenants=tenants,
        priority_classes=core_classes,
        running=running,
        pending=pending,
        decayed_usage=dict(decayed),
    )
    jobs = {r["id"]: r for r in [*running_rows.values(), *pending_rows]}
    return Built(snapshot, jobs, [r["id"] for r in pending_rows], node_ids, devices)


_NodeParts = tuple[dict[str, CoreNode], dict[tuple[str, int], int], dict[str, int]]

# Versions of what changes rarely, in one query (PostgreSQL). The inventory: every write to
# a node bumps its `updated_at` (device health changes included, see `scheduler.nodes.services`),
# summed rather than maxed so any bump changes it. The organisation: tenants, quotas and
# priority classes by their row versions (`xmin`, new on every UPDATE) and counts, and the
# clusters' names and labels themselves (their rows change at every cycle that sees them).
VERSIONS_SQL = (
    "SELECT (SELECT row(count(*), max(id), sum(extract(epoch FROM updated_at)))::text"
    " FROM {node}), (SELECT count(*) FROM {device}),"
    " (SELECT row(count(*), sum(xmin::text::bigint))::text FROM {tenant}),"
    " (SELECT row(count(*), sum(xmin::text::bigint))::text FROM {quota}),"
    " (SELECT row(count(*), sum(xmin::text::bigint))::text FROM {pclass}),"
    " (SELECT string_agg(name || '=' || labels::text, ',' ORDER BY name) FROM {cluster})"
)


@functools.cache
def _versions_sql() -> str:
    return VERSIONS_SQL.format(
        node=Node._meta.db_table,
        device=GpuDevice._meta.db_table,
        tenant=Tenant._meta.db_table,
        quota=QuotaRow._meta.db_table,
        pclass=PriorityClassRow._meta.db_table,
        cluster=Cluster._meta.db_table,
    )


def _versions() -> tuple[tuple[Any, ...], tuple[Any, ...]] | None:
    """(inventory version, organisation version) on PostgreSQL; None elsewhere (read all)."""
    if connection.vendor != "postgresql":
        return None
    with connection.cursor() as cursor:
        cursor.execute(_versions_sql())
        row = cursor.fetchone()
    return tuple(row[:2]), tuple(row[2:])


def _nodes(version: tuple[Any, ...] | None, cache: SnapshotCache) -> _NodeParts:
    """The inventory part of the snapshot, cached (PostgreSQL) while `version` is unchanged."""
    if version is None:
        return load_nodes()
    if cache.nodes is not None and cache.nodes[0] == version:
        parts: _NodeParts = cache.nodes[1]
        return parts
    parts = load_nodes()
    cache.nodes = (version, parts)
    return parts


_Org = tuple[
    tuple[CoreTenant, ...],
    dict[int, str],
    dict[int, dict[str, Any]],
    tuple[PriorityClass, ...],
    dict[str, dict[str, str]],
]


def _organisation(version: tuple[Any, ...] | None, cache: SnapshotCache) -> _Org:
    """Tenants with their quotas, priority classes and the clusters' labels: read again only
    when `version` changed (always without one). The engine's job views name tenants and
    classes, and name clusters by their labels, so they are dropped with them."""
    if version is not None and cache.org is not None and cache.org[0] == version:
        org: _Org = cache.org[1]
        return org
    tenants, slugs = load_tenants()
    classes: dict[int, dict[str, Any]] = {
        pc["id"]: dict(pc)
        for pc in PriorityClassRow.objects.values(
            "id", "name", "value", "may_preempt", "preemptible", "counts_against_quota"
        )
    }
    core_classes = priority_classes(classes.values())
    made: _Org = (tenants, slugs, classes, core_classes, cluster_labels())
    cache.requests.clear()
    cache.org = (version, made) if version is not None else None
    return made


def _shares(active: Sequence[int], cache: SnapshotCache) -> dict[int, tuple[DeviceShare, ...]]:
    """Device shares of the active allocations: from the cache, reading only new ones."""
    known = cache.shares
    missing = [i for i in active if i not in known]
    if missing:
        found: dict[int, list[DeviceShare]] = {i: [] for i in missing}
        for row in AllocationDevice.objects.filter(allocation_id__any=missing).values(
            "allocation_id", "device__index", "milli", "memory_mib"
        ):
            found[row["allocation_id"]].append(
                DeviceShare(
                    device=row["device__index"], milli=row["milli"], memory_mib=row["memory_mib"]
                )
            )
        known.update(
            (i, tuple(sorted(v, key=lambda share: share.device))) for i, v in found.items()
        )
    if len(known) > len(active):
        keep = set(active)
        for gone in [i for i in known if i not in keep]:
            del known[gone]
    return known


PREEMPTED_EVENT = "preempted"  # the kind of a victim's event (scheduler.daemon.apply)
# Longer than any sensible ping-pong guard of the profile; the engine applies the exact one.
DISPLACED_LOOKBACK_S = 6 * 3600


@functools.cache
def _displaced_sql() -> str:
    # The kind in the text, not a value: a plan made for any value (the daemon's sessions
    # may keep one, `scheduler.leader.DAEMON_PLAN_CACHE_MODE`) could not use the partial
    # index of failures and preemptions by time (jobevent_failures_at).
    return (
        f"SELECT id, at, job_id, data FROM {JobEvent._meta.db_table}"  # noqa: S608 - our names
        f" WHERE kind = '{PREEMPTED_EVENT}' AND at >= %s AND id > %s ORDER BY id"
    )


def _displaced(cache: SnapshotCache) -> dict[int, tuple[str, ...]]:
    """Preemptor job id -> the jobs it preempted lately, read from the victims' events, so
    that a victim's retry cannot preempt its preemptor straight back (no ping-pong).
    Events carry wall-clock times, so the look-back is on the wall clock too. Events are
    only ever added, and `preempted` ones only by the leading daemon, one transaction at a
    time: the cache reads those after the last id it holds."""
    since = timezone.now() - timedelta(seconds=DISPLACED_LOOKBACK_S)
    with connection.cursor() as cursor:
        cursor.execute(_displaced_sql(), [since, cache.preemptions_after])
        rows = cursor.fetchall()
    for event_id, at, victim, data in rows:
        if isinstance(data, str):  # JSON arrives as text (Django's loaders)
            data = json.loads(data)
        at = aware(at)
        preemptor = str((data or {}).get("preemptor", ""))
        cache.preemptions_after = max(cache.preemptions_after, event_id)
        if preemptor.isdigit():
            cache.preemptions.append((event_id, at, int(preemptor), str(victim)))
            cache.displaced = None
    # Held in id order, which is nearly time order: the oldest tells whether any expired.
    if cache.preemptions and cache.preemptions[0][1] < since:
        cache.preemptions = [p for p in cache.preemptions if p[1] >= since]
        cache.displaced = None
    if cache.displaced is not None:
        return cache.displaced
    out: dict[int, set[str]] = defaultdict(set)
    for _, _, preemptor_id, victim_id in cache.preemptions:
        out[preemptor_id].add(victim_id)
    cache.displaced = {job: tuple(sorted(victims)) for job, victims in out.items()}
    return cache.displaced


# --- bulk writes ------


# The snapshot as the daemon has already decided it, for the start estimates' replay
# (scheduler.estimates.refresh). A job holding devices in one of these states runs (or is about
# to); in any other it is giving them back: preempted or requeued (its pods stopping), or ended.
LIVE = frozenset({JobState.ADMITTED, JobState.BINDING, JobState.RUNNING})


def as_planned(snapshot: Snapshot, rows: Mapping[int, Mapping[str, Any]]) -> Snapshot:
    """The snapshot as the daemon has already decided it: a job that holds devices but no
    longer runs gives them back now in the replay (a preemption or reclaim under way), and
    one requeued waits in the queue again, so that it has its position and estimate from
    the first refresh after its requeue rather than once its pods are gone."""
    state = {core_job_id(key): row["state"] for key, row in rows.items()}
    leaving = [r for r in snapshot.running if state.get(r.job.id, JobState.RUNNING) not in LIVE]
    if not leaving:
        return snapshot
    queued = {job.id for job in snapshot.pending}
    back = [r.job for r in leaving if state[r.job.id] == JobState.QUEUED and r.job.id not in queued]
    gone = {r.job.id for r in leaving}
    return replace(
        snapshot,
        running=tuple(r for r in snapshot.running if r.job.id not in gone),
        pending=(*snapshot.pending, *back),
    )
