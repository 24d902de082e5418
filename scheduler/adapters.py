"""Database <-> core: build a Snapshot in a fixed number of queries, and the bulk writes the
daemon makes (compare-and-swap transitions, allocations, releases, events).

Core ids: a job is `str(job.pk)`, a tenant its slug, a node its name, a flavor its name.
Snapshot building reads, in order: the versions of the inventory and the organisation
(nodes and devices, tenants, quotas and priority classes when they changed), the active
allocations, the versions of the jobs holding them, their rows, the device shares, recent
preemptions, the queue's versions and rows: a fixed number of queries whatever the size of
the cluster (eleven with a cold cache, six warm; a test pins both). `SnapshotCache` keeps
what did not change between cycles.
"""

from __future__ import annotations

import functools
import json
import logging
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from django.db import connection
from django.db.models import Exists, F, OuterRef, Window
from django.db.models.expressions import RawSQL
from django.db.models.functions import RowNumber
from django.utils import timezone
from django.utils.dateparse import parse_datetime

from scheduler.core.types import (
    Device,
    DeviceShare,
    JobKind,
    JobRequest,
    PriorityClass,
    Quota,
    ReplicaAssignment,
    Resources,
    RunningJob,
    Snapshot,
    Taint,
)
from scheduler.core.types import Node as CoreNode
from scheduler.core.types import Tenant as CoreTenant
from scheduler.models import (
    Allocation,
    AllocationDevice,
    GpuDevice,
    Job,
    JobEvent,
    JobState,
    Node,
)
from tenants.models import PriorityClass as PriorityClassRow
from tenants.models import Quota as QuotaRow
from tenants.models import Tenant

log = logging.getLogger("gantry.daemon")
S = JobState
# Holding states whose pods have not started: the engine may preempt them inside the
# minimum runtime (`RunningJob.started`).
NOT_STARTED = frozenset({S.ADMITTED, S.BINDING})
JOB_FIELDS = (
    "id",
    "tenant_id",
    "project_id",
    "priority_class_id",
    "job_type",
    "state",
    "replicas",
    "gpu_milli_per_replica",
    "gpu_memory_mib",
    "cpu_milli",
    "memory_mib",
    "flavors",
    "max_runtime_s",
    "attempt",
    "queued_at",
    "started_at",
    "not_before",
    "reason",
    "submitted_by_id",
    "project__namespace",
    "name",
)
# The spec keys the engine needs, read as JSON paths so the whole spec (commands,
# environment) is not parsed for every job of every cycle.
SPEC_KEYS = {
    "min_replicas": "spec__min_replicas",
    "pools": "spec__pools",
    "estimated_runtime_s": "spec__estimated_runtime_s",
    "checkpointable": "spec__checkpointable",
    "rdma": "spec__resources__rdma",
}
# Read with the rows for the daemon's reconcile, not the engine.
ROW_EXTRA = ("spec__retry",)
ROW_FIELDS = (*JOB_FIELDS, *SPEC_KEYS.values(), *ROW_EXTRA)
KINDS = {k.value.replace("_", "-"): k for k in JobKind}


def aware(value: datetime | str) -> datetime:
    """A time read through a raw cursor, as the ORM would give it: aware, in UTC. SQLite
    stores times as naive UTC text, and a raw cursor bypasses the ORM's converters; compared
    with an aware time, a naive one raises TypeError (which once stopped the daemon for good
    after the first preemption on the embedded default)."""
    if isinstance(value, str):
        parsed = parse_datetime(value)
        if parsed is None:
            raise ValueError(f"not a time: {value!r}")
        value = parsed
    return value if timezone.is_aware(value) else value.replace(tzinfo=UTC)


def ts(value: datetime | None) -> float:
    return value.timestamp() if value is not None else 0.0


@dataclass
class Built:
    """A snapshot and the rows behind it, for the daemon to act on decisions."""

    snapshot: Snapshot
    jobs: dict[str, dict[str, Any]]  # core id -> job row (values), pending and running
    pending_ids: list[int]
    nodes: dict[str, int]  # node name -> id
    devices: dict[tuple[str, int], int]  # (node name, index) -> device id


@dataclass
class SnapshotCache:
    """What a daemon keeps between cycles, so that a cycle reads only what changed:

    - the device shares of each active allocation (written once with the allocation, never
      changed until it ends);
    - job rows with their PostgreSQL row version (`xmin`: every UPDATE of a row writes a new
      version under a new transaction id), so only the rows of jobs new or changed since the
      last cycle are read whole. On other databases every row is read each cycle."""

    shares: dict[int, tuple[DeviceShare, ...]] = field(default_factory=dict)
    rows: dict[int, tuple[int, dict[str, Any]]] = field(default_factory=dict)
    # The engine's view of a row (kept while the row and the organisation are unchanged).
    requests: dict[int, tuple[dict[str, Any], JobRequest]] = field(default_factory=dict)
    # Tenants, quotas and priority classes, with the version they were read at.
    org: tuple[Any, Any] | None = None
    # Recent preemptions: (event id, at, preemptor id, victim id), read after the last id.
    preemptions: list[tuple[int, datetime, int, str]] = field(default_factory=list)
    preemptions_after: int = 0
    # What the snapshot makes of them (preemptor -> victims), until they change.
    displaced: dict[int, tuple[str, ...]] | None = None
    # Active allocations (reconcile's fields) with their row and node versions.
    allocations: dict[int, tuple[tuple[int, int], dict[str, Any]]] = field(default_factory=dict)

    def remember(self, versions: Mapping[int, int], fields: Mapping[str, Any]) -> None:
        """After a committed write of `fields` by this daemon to the rows of `versions`
        (job id -> the row version the UPDATE returned): the cache takes the new versions,
        so the next snapshot need not read those rows again. Only for rows written once in
        that transaction (a second write in the same transaction has the same version).
        Rows are replaced, not changed in place: the rows a cycle read stay as read."""
        for job_id, version in versions.items():
            kept = self.rows.get(job_id)
            if kept is not None:
                self.rows[job_id] = (version, {**kept[1], **fields})

    def request(
        self, row: dict[str, Any], slugs: Mapping[int, str], classes: Mapping[int, Any]
    ) -> JobRequest:
        """The JobRequest of `row`: built again only when a field it is made of changed.
        A job's row gets a new version at every step of its life (admitted, binding,
        running, a new reason), which the engine's view of it does not depend on; keeping
        the same object also makes the engine's comparisons of what runs cheap."""
        kept = self.requests.get(row["id"])
        if kept is not None:
            if kept[0] is row:
                return kept[1]
            if _request_inputs(kept[0]) == _request_inputs(row):
                self.requests[row["id"]] = (row, kept[1])
                return kept[1]
        made = job_request(row, slugs, classes)
        self.requests[row["id"]] = (row, made)
        return made


# The fields of a job row `job_request` reads: every column read except those that change
# at each step of a job's life and which it does not read (a column added to JOB_FIELDS is
# compared until it is named here). The organisation's names come from `_organisation`,
# whose change clears `SnapshotCache.requests`.
_NOT_IN_REQUEST = frozenset(
    {"id", "project_id", "state", "started_at", "reason", "project__namespace", "name"}
)
REQUEST_INPUTS = (
    *(name for name in JOB_FIELDS if name not in _NOT_IN_REQUEST),
    *SPEC_KEYS.values(),
)


def _request_inputs(row: Mapping[str, Any]) -> tuple[Any, ...]:
    return tuple(map(row.get, REQUEST_INPUTS))


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
    nodes, devices, node_ids = _nodes(versions[0] if versions else None)
    tenants, slugs, classes, core_classes = _organisation(versions[1] if versions else None, cache)
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
    running = _running(allocations, shares, running_rows, slugs, classes, _displaced(cache), cache)
    if per_queue and connection.vendor == "postgresql":
        window = _rows_by_version(queue_heads(max_pending, per_queue), cache)
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
    pending = tuple(cache.request(r, slugs, classes) for r in pending_rows)
    snapshot = Snapshot(
        now, tuple(nodes.values()), tenants, core_classes, running, pending, dict(decayed)
    )
    jobs = {str(r["id"]): r for r in [*running_rows.values(), *pending_rows]}
    return Built(snapshot, jobs, [r["id"] for r in pending_rows], node_ids, devices)


def holds_allocation() -> Exists:
    """For `Job.objects.filter(...)`: the job holds an active allocation."""
    return Exists(Allocation.objects.filter(job_id=OuterRef("pk"), ended_at__isnull=True))


# A row's version on PostgreSQL: the id of the transaction that wrote it.
_VERSION = RawSQL("scheduler_job.xmin::text::bigint", ())


_compiled: dict[tuple[Any, ...], tuple[str, tuple[Any, ...]]] = {}


def fetch_compiled(key: tuple[Any, ...], query: Callable[[], Any]) -> list[tuple[Any, ...]]:
    """The rows of the queryset `query()` builds, which must depend on `key` alone: built
    and compiled to SQL once per key and process, then executed as SQL. The daemon runs the
    same few reads every cycle, and building and compiling them through the ORM cost more
    than running them."""
    compiled = _compiled.get(key)
    if compiled is None:
        compiled = _compiled[key] = query().query.sql_with_params()
    with connection.cursor() as cursor:
        cursor.execute(*compiled)
        return cursor.fetchall()


def running_job_rows(cache: SnapshotCache) -> list[dict[str, Any]]:
    """The rows of the jobs holding an active allocation, through the cache (`_job_rows`)."""
    # A semi-join rather than the ids: thousands of ids as parameters cost more.
    return _job_rows(("running",), lambda: Job.objects.filter(holds_allocation()), cache)


def _job_rows(
    key: tuple[Any, ...], jobs: Callable[[], Any], cache: SnapshotCache
) -> list[dict[str, Any]]:
    """The rows (JOB_FIELDS, the spec keys and ROW_EXTRA) of the jobs of the queryset `jobs()`
    (which depends on `key` alone, see `fetch_compiled`): on PostgreSQL their ids and
    versions first, then whole rows only for the jobs the cache lacks or holds an older
    version of."""
    if connection.vendor != "postgresql":
        return list(jobs().values(*ROW_FIELDS))
    versions = fetch_compiled(
        ("versions", *key),
        lambda: jobs().order_by().annotate(version=_VERSION).values_list("id", "version"),
    )
    return _rows_by_version(versions, cache)


def _rows_by_version(
    versions: Sequence[tuple[int, int]], cache: SnapshotCache
) -> list[dict[str, Any]]:
    """The cached rows of (id, version) pairs, reading whole only those the cache lacks or
    holds an older version of."""
    known = cache.rows
    missing = [i for i, v in versions if i not in known or known[i][0] != v]
    if missing:
        reread(missing, cache)
    return [known[i][1] for i, _ in versions if i in known]


def reread(ids: Sequence[int], cache: SnapshotCache) -> dict[int, dict[str, Any]]:
    """Read the rows of `ids` whole, with their versions, into the cache (PostgreSQL);
    jobs that no longer exist are dropped from it. Returns id -> row."""
    if connection.vendor != "postgresql":
        return {r["id"]: r for r in Job.objects.filter(id__any=ids).values(*ROW_FIELDS)}
    found: dict[int, dict[str, Any]] = {}
    for row in (
        Job.objects.filter(id__any=ids).annotate(version=_VERSION).values(*ROW_FIELDS, "version")
    ):
        cache.rows[row["id"]] = (row.pop("version"), row)
        found[row["id"]] = row
    for gone in set(ids) - found.keys():
        cache.rows.pop(gone, None)
    return found


HEADS_SQL = (
    "SELECT h.id, h.version, h.place FROM {tenant} t CROSS JOIN {pclass} pc CROSS JOIN LATERAL ("
    " SELECT j.id, j.xmin::text::bigint AS version, j.queued_at,"
    " row_number() OVER (ORDER BY j.queued_at, j.id) AS place"
    " FROM {job} j WHERE j.tenant_id = t.id AND j.priority_class_id = pc.id AND j.state = %s"
    " ORDER BY j.queued_at, j.id LIMIT %s) h"
    " ORDER BY h.place, pc.value DESC, h.queued_at, h.id LIMIT %s"
)
# The number of queues that held jobs at the last read of the heads (per window shape).
_queues_seen: dict[tuple[int, int], int] = {}


@functools.cache
def _heads_sql() -> str:
    return HEADS_SQL.format(
        tenant=Tenant._meta.db_table, pclass=PriorityClassRow._meta.db_table, job=Job._meta.db_table
    )


def queue_heads(max_pending: int, per_queue: int) -> list[tuple[int, int]]:
    """(id, version) of the jobs in the window `_queue` describes, on PostgreSQL: one index
    probe per queue (job_queue_heads), each reading only as deep as the round-robin can
    reach. With Q queues holding jobs, a window of `max_pending` takes about
    `max_pending / Q` from each; reading `per_queue` from every queue to keep 500 of
    thousands was most of a quiet cycle's database time.

    Reading the first L of each queue (L <= `per_queue`) gives the same window whenever it
    yields `max_pending` jobs (every job it leaves out is deeper than L in its queue, so
    it comes after all it read in the round-robin order) or no queue had L jobs to give
    (nothing was left out). Otherwise it reads again at the full depth. L is sized from the number
    of queues the previous read found, with room for queues that run dry."""
    shape = (max_pending, per_queue)
    queues = _queues_seen.get(shape)
    depth = per_queue if queues is None else min(per_queue, -(-max_pending * 5 // (4 * queues)) + 1)
    with connection.cursor() as cursor:
        while True:
            cursor.execute(_heads_sql(), (S.QUEUED, depth, max_pending))
            rows = cursor.fetchall()
            deepest = max((place for _, _, place in rows), default=0)
            if len(rows) >= max_pending or deepest < depth or depth >= per_queue:
                break
            depth = per_queue
    _queues_seen[shape] = max(1, sum(1 for _, _, place in rows if place == 1))
    return [(job_id, version) for job_id, version, _ in rows]


def _queue(max_pending: int, per_queue: int) -> Any:
    """The queued jobs the engine sees. Without `per_queue`: the first `max_pending` by
    priority, then age. With it: each queue's (tenant x priority class) first `per_queue` by
    age, and when those are more than `max_pending`, taken round-robin across the queues
    (every queue's first job, then every queue's second...). A window by priority alone
    fills up with high-priority jobs that cannot fit (say 5 GPUs, where nodes have 3 left)
    and hides the small jobs that could use the gaps; the engine orders what it sees.
    (On PostgreSQL the per-queue window is read by `queue_heads`.)"""
    queued = Job.objects.filter(state=S.QUEUED)
    if not per_queue:
        first = queued.order_by(-F("priority_class__value"), "queued_at", "id")
        return Job.objects.filter(id__in=first.values("id")[:max_pending])
    place = Window(
        RowNumber(),
        partition_by=[F("tenant_id"), F("priority_class_id")],
        order_by=[F("queued_at").asc(), F("id").asc()],
    )
    heads = (
        queued.annotate(place=place)
        .filter(place__lte=per_queue)
        .order_by("place", -F("priority_class__value"), "queued_at", "id")
        .values("id")[:max_pending]
    )
    return Job.objects.filter(id__in=heads)


_NodeParts = tuple[dict[str, CoreNode], dict[tuple[str, int], int], dict[str, int]]
_node_cache: dict[str, Any] = {}

# Versions of what changes rarely, in one query (PostgreSQL). The inventory: every write to
# a node bumps its `updated_at` (device health changes included, see `scheduler.nodes`),
# summed rather than maxed so any bump changes it. The organisation: tenants, quotas and
# priority classes by their row versions (`xmin`, new on every UPDATE) and counts.
VERSIONS_SQL = (
    "SELECT (SELECT row(count(*), max(id), sum(extract(epoch FROM updated_at)))::text"
    " FROM {node}), (SELECT count(*) FROM {device}),"
    " (SELECT row(count(*), sum(xmin::text::bigint))::text FROM {tenant}),"
    " (SELECT row(count(*), sum(xmin::text::bigint))::text FROM {quota}),"
    " (SELECT row(count(*), sum(xmin::text::bigint))::text FROM {pclass})"
)


@functools.cache
def _versions_sql() -> str:
    return VERSIONS_SQL.format(
        node=Node._meta.db_table,
        device=GpuDevice._meta.db_table,
        tenant=Tenant._meta.db_table,
        quota=QuotaRow._meta.db_table,
        pclass=PriorityClassRow._meta.db_table,
    )


def _versions() -> tuple[tuple[Any, ...], tuple[Any, ...]] | None:
    """(inventory version, organisation version) on PostgreSQL; None elsewhere (read all)."""
    if connection.vendor != "postgresql":
        return None
    with connection.cursor() as cursor:
        cursor.execute(_versions_sql())
        row = cursor.fetchone()
    return tuple(row[:2]), tuple(row[2:])


def _nodes(version: tuple[Any, ...] | None = None) -> _NodeParts:
    """The inventory part of the snapshot, cached (PostgreSQL) while `version` is unchanged."""
    if version is None:
        return _load_nodes()
    if _node_cache.get("version") == version:
        parts: _NodeParts = _node_cache["parts"]
        return parts
    parts = _load_nodes()
    _node_cache.update(version=version, parts=parts)
    return parts


_Org = tuple[
    tuple[CoreTenant, ...], dict[int, str], dict[int, dict[str, Any]], tuple[PriorityClass, ...]
]


def _organisation(version: tuple[Any, ...] | None, cache: SnapshotCache) -> _Org:
    """Tenants with their quotas, and priority classes: read again only when `version`
    changed (always without one). The engine's job views name tenants and classes, so they
    are dropped with them."""
    if version is not None and cache.org is not None and cache.org[0] == version:
        org: _Org = cache.org[1]
        return org
    tenants, slugs = _tenants()
    classes: dict[int, dict[str, Any]] = {
        pc["id"]: dict(pc)
        for pc in PriorityClassRow.objects.values(
            "id", "name", "value", "may_preempt", "preemptible", "counts_against_quota"
        )
    }
    core_classes = tuple(
        PriorityClass(
            pc["name"],
            pc["value"],
            pc["may_preempt"],
            pc["preemptible"],
            pc["counts_against_quota"],
            critical=not pc["preemptible"],
        )
        for pc in classes.values()
    )
    made: _Org = (tenants, slugs, classes, core_classes)
    cache.requests.clear()
    cache.org = (version, made) if version is not None else None
    return made


def _load_nodes() -> _NodeParts:
    rows = list(Node.objects.filter(present=True).values())
    by_id = {r["id"]: r for r in rows}
    per_node: dict[int, list[Device]] = defaultdict(list)
    device_ids: dict[tuple[str, int], int] = {}
    for d in GpuDevice.objects.filter(node__present=True).values(
        "id", "node_id", "index", "memory_mib", "healthy"
    ):
        per_node[d["node_id"]].append(Device(d["index"], d["memory_mib"], d["healthy"]))
        device_ids[(by_id[d["node_id"]]["name"], d["index"])] = d["id"]
    nodes = {}
    for r in rows:
        taints = tuple(Taint(*t) for t in r["taints"])
        nodes[r["name"]] = CoreNode(
            r["name"],
            r["flavor"],
            tuple(sorted(per_node[r["id"]], key=lambda d: d.index)),
            r["cpu_milli"],
            r["memory_mib"],
            r["rdma"],
            r["pool"],
            r["labels"],
            taints,
            healthy=r["ready"] and not r["sim_failed"],
            cordoned=r["cordoned"] or r["cluster_unschedulable"],
        )
    return nodes, device_ids, {r["name"]: r["id"] for r in rows}


def _tenants() -> tuple[tuple[CoreTenant, ...], dict[int, str]]:
    rows = list(Tenant.objects.values("id", "slug", "parent_id"))
    slugs = {r["id"]: r["slug"] for r in rows}
    quotas: dict[int, dict[str, Quota]] = defaultdict(dict)
    weights: dict[int, float] = {}
    user_caps: dict[int, dict[str, int]] = defaultdict(dict)
    for q in QuotaRow.objects.values(
        "tenant_id",
        "flavor__name",
        "guaranteed_milli",
        "limit_milli",
        "lend_limit_milli",
        "weight",
        "user_limit_milli",
    ):
        quotas[q["tenant_id"]][q["flavor__name"]] = Quota(
            q["guaranteed_milli"], q["limit_milli"], q["lend_limit_milli"]
        )
        weights[q["tenant_id"]] = max(weights.get(q["tenant_id"], 0.0), float(q["weight"]))
        if q["user_limit_milli"] is not None:  # per flavor; 0 is a cap
            user_caps[q["tenant_id"]][q["flavor__name"]] = q["user_limit_milli"]
    tenants = tuple(
        CoreTenant(
            r["slug"],
            slugs.get(r["parent_id"]),
            quotas.get(r["id"], {}),
            weights.get(r["id"], 1.0),
            user_caps.get(r["id"], {}),
        )
        for r in rows
    )
    return tenants, slugs


def job_request(
    row: Mapping[str, Any], slugs: Mapping[int, str], classes: Mapping[int, Any]
) -> JobRequest:
    spec = {key: row.get(path) for key, path in SPEC_KEYS.items()}
    inference = row["job_type"] == "inference"
    return JobRequest(
        id=str(row["id"]),
        tenant=slugs.get(row["tenant_id"], ""),
        priority_class=classes[row["priority_class_id"]]["name"],
        resources=Resources(
            row["gpu_milli_per_replica"],
            row["gpu_memory_mib"] or 0,
            row["cpu_milli"],
            row["memory_mib"],
            spec["rdma"] or 0,
        ),
        replicas=row["replicas"],
        user=str(row["submitted_by_id"]),
        kind=KINDS.get(row["job_type"], JobKind.BATCH),
        min_replicas=min(spec.get("min_replicas") or 1, row["replicas"]) if inference else None,
        flavors=tuple(row["flavors"] or ()),
        pools=tuple(spec.get("pools") or ()),
        submitted_at=ts(row["queued_at"]),
        max_runtime_s=row["max_runtime_s"],
        estimated_runtime_s=spec.get("estimated_runtime_s"),
        checkpointable=bool(spec.get("checkpointable")),
        not_before=ts(row["not_before"]),
        attempt=row["attempt"],
    )


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
                DeviceShare(row["device__index"], row["milli"], row["memory_mib"])
            )
        known.update(
            (i, tuple(sorted(v, key=lambda share: share.device))) for i, v in found.items()
        )
    if len(known) > len(active):
        keep = set(active)
        for gone in [i for i in known if i not in keep]:
            del known[gone]
    return known


def _running(
    allocations: Sequence[Mapping[str, Any]],
    shares: Mapping[int, tuple[DeviceShare, ...]],
    rows: Mapping[int, dict[str, Any]],
    slugs: Mapping[int, str],
    classes: Mapping[int, Any],
    displaced: Mapping[int, tuple[str, ...]],
    cache: SnapshotCache,
) -> tuple[RunningJob, ...]:
    per_job: dict[int, list[Any]] = defaultdict(list)
    for a in allocations:
        if a["job_id"] in rows:
            per_job[a["job_id"]].append(a)
    out = []
    for job_id, allocs in sorted(per_job.items()):
        request = cache.request(rows[job_id], slugs, classes)
        assignments = tuple(
            ReplicaAssignment(a["replica"], a["node__name"], shares[a["id"]], a["elastic"])
            for a in sorted(allocs, key=lambda a: a["replica"])
        )
        started = min(ts(a["started_at"]) for a in allocs)
        out.append(
            RunningJob(
                request,
                allocs[0]["flavor"],
                assignments,
                started,
                preempted=displaced.get(job_id, ()),
                started=rows[job_id]["state"] not in NOT_STARTED,
            )
        )
    return tuple(out)


# Longer than any sensible ping-pong guard of the profile; the engine applies the exact one.
DISPLACED_LOOKBACK_S = 6 * 3600


@functools.cache
def _displaced_sql() -> str:
    return (
        f"SELECT id, at, job_id, data FROM {JobEvent._meta.db_table}"  # noqa: S608 - our names
        " WHERE kind = %s AND at >= %s AND id > %s ORDER BY id"
    )


def _displaced(cache: SnapshotCache) -> dict[int, tuple[str, ...]]:
    """Preemptor job id -> the jobs it preempted lately, read from the victims' events, so
    that a victim's retry cannot preempt its preemptor straight back (no ping-pong).
    Events carry wall-clock times, so the look-back is on the wall clock too. Events are
    only ever added, and `preempted` ones only by the leading daemon, one transaction at a
    time: the cache reads those after the last id it holds."""
    since = timezone.now() - timedelta(seconds=DISPLACED_LOOKBACK_S)
    with connection.cursor() as cursor:
        cursor.execute(_displaced_sql(), ["preempted", since, cache.preemptions_after])
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


REASONS_SQL = (  # by primary key, as CLAIM_SQL
    "UPDATE scheduler_job AS j SET reason = v.reason"
    " FROM unnest(%s::bigint[], %s::text[]) AS v(id, reason)"
    " WHERE j.id = v.id AND j.state || '' = %s RETURNING j.id, j.xmin::text::bigint, v.reason"
)


def set_reasons(reasons: Mapping[int, str], versions: dict[int, int] | None = None) -> int:
    """Write each queued job's new reason. PostgreSQL: one UPDATE from arrays, whose new row
    versions go to `versions` when given. Elsewhere: one UPDATE per distinct text (equal jobs
    wait for equal reasons)."""
    changed = {i: r[:500] for i, r in reasons.items()}
    if not changed:
        return 0
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute(REASONS_SQL, [list(changed), list(changed.values()), S.QUEUED])
            written = cursor.fetchall()
        if versions is not None:
            versions.update((job_id, version) for job_id, version, _ in written)
        return len(written)
    by_text: dict[str, list[int]] = defaultdict(list)
    for job_id, text in changed.items():
        by_text[text].append(job_id)
    return sum(
        Job.objects.filter(id__in=ids, state=S.QUEUED).update(reason=text)
        for text, ids in by_text.items()
    )


# By primary key, as CLAIM_SQL: written plainly, `ended_at IS NULL` let the planner take a
# partial index of active allocations, which holds an entry for every allocation ended
# since the last VACUUM (20,000 entries read to end 100 in bench.daemon_drain).
RELEASE_SQL = (
    "UPDATE scheduler_allocation SET ended_at = %s, end_reason = %s"
    " WHERE id = ANY(%s) AND num_nulls(ended_at) = 1"
)


def release(allocation_ids: Sequence[int], now: datetime, reason: str) -> int:
    """End allocations and give their device shares back (the trigger frees the devices).
    The ids go as one parameter (`RELEASE_SQL`, `__any`): a cycle releases thousands."""
    if not allocation_ids:
        return 0
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute(RELEASE_SQL, [now, reason[:200], list(allocation_ids)])
            ended = cursor.rowcount
    else:
        ended = Allocation.objects.filter(id__any=allocation_ids, ended_at__isnull=True).update(
            ended_at=now, end_reason=reason[:200]
        )
    AllocationDevice.objects.filter(allocation_id__any=allocation_ids, released=False).update(
        released=True
    )
    return ended
