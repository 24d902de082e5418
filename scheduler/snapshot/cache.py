"""What the daemon keeps between cycles so that a cycle reads only what changed, and the reads
of job rows through it (by row version: whole rows only for the jobs new or changed)."""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from django.db import connection

from common.compiled import fetch_by_ids, fetch_compiled
from scheduler.core.types import DeviceShare, JobRequest, RunningJob
from scheduler.models import (
    Job,
    JobState,
)
from scheduler.snapshot.rows import (
    _VERSION,
    JOB_FIELDS,
    ROW_FIELDS,
    SPEC_KEYS,
    holds_allocation,
)
from scheduler.snapshot.translate import job_request

log = logging.getLogger("gantry.daemon")
S = JobState


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
    # What runs as the engine sees it, kept while made of the same objects (`running_jobs`).
    running: dict[int, tuple[tuple[Any, ...], RunningJob]] = field(default_factory=dict)
    # Tenants, quotas and priority classes, with the version they were read at.
    org: tuple[Any, Any] | None = None
    # Recent preemptions: (event id, at, preemptor id, victim id), read after the last id.
    preemptions: list[tuple[int, datetime, int, str]] = field(default_factory=list)
    preemptions_after: int = 0
    # What the snapshot makes of them (preemptor -> victims), until they change.
    displaced: dict[int, tuple[str, ...]] | None = None
    # Active allocations (reconcile's fields) with their row and node versions.
    allocations: dict[int, tuple[tuple[int, int], dict[str, Any]]] = field(default_factory=dict)
    # The inventory's parts (nodes, device ids, node ids), with the version they were read at.
    nodes: tuple[Any, Any] | None = None
    # The number of queues that held jobs at the last read of the queue heads, per window
    # shape (`scheduler.snapshot.queue.queue_heads`).
    queues_seen: dict[tuple[int, int], int] = field(default_factory=dict)

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
        self,
        row: dict[str, Any],
        slugs: Mapping[int, str],
        classes: Mapping[int, Any],
        clusters: Mapping[str, Mapping[str, str]] | None = None,
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
        made = job_request(row, slugs, classes, clusters)
        self.requests[row["id"]] = (row, made)
        return made


# The fields of a job row `job_request` reads: every column read except those that change
# at each step of a job's life and which it does not read (a column added to JOB_FIELDS is
# compared until it is named here). The organisation's names and the clusters' labels come
# from `_organisation`, whose change clears `SnapshotCache.requests`.
_NOT_IN_REQUEST = frozenset(
    {"id", "project_id", "state", "started_at", "reason", "project__namespace", "name"}
)


REQUEST_INPUTS = (
    *(name for name in JOB_FIELDS if name not in _NOT_IN_REQUEST),
    *SPEC_KEYS.values(),
)


def _request_inputs(row: Mapping[str, Any]) -> tuple[Any, ...]:
    return tuple(map(row.get, REQUEST_INPUTS))


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
    return rows_by_version(versions, cache)


def rows_by_version(
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
    for row in fetch_by_ids(
        ("rows",),
        lambda some: (
            Job.objects.filter(id__any=some)
            .annotate(version=_VERSION)
            .values(*ROW_FIELDS, "version")
        ),
        ids,
    ):
        cache.rows[row["id"]] = (row.pop("version"), row)
        found[row["id"]] = row
    for gone in set(ids) - found.keys():
        cache.rows.pop(gone, None)
    return found
