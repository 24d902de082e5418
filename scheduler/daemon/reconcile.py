"""Reconcile, level-based: what the cluster reports wins.

Called at the start of every cycle, when no claim of this daemon is in flight, so an
`admitted` job found here was claimed by a daemon that died before committing its binds.

1. Pods without an active allocation are orphans: reported and deleted (but not the pods an
   operator makes beside an admitted attempt's replicas, bound with its replica 0:
   `scheduler.daemon.companions`).
2. Allocations that are stopping (preempted, scaled down, an older attempt, a job that
   ended): their pod is deleted; once it is gone the allocation is released. A pod on a node
   NotReady or gone for `Limits.node_lost_grace_s` counts as gone (no kubelet will
   confirm its deletion: Terminating for ever): it is force-deleted and released, as
   Kubernetes' pod garbage collector does with the pods of lost nodes.
3. Each job holding allocations is judged on its pods: adopt a crashed claim (all pods exist:
   bind the unbound ones) or release it; running when its pods run (written after the
   cycle's binds, `write_starts`); succeeded when they have; an attempt failed on a failed
   or vanished pod, a lost node or an unhealthy GPU (retried per the job's policy), or a pod
   bound but not started within `Limits.binding_timeout_s` (with the cause the cluster
   reports; retried per the job's policy); failed past its max runtime. A companion pod
   that failed (`scheduler.daemon.companions.faults`) is told as the job's reason; one that
   cannot pull its image fails the attempt past the binding deadline (no operator would).
4. Preempted jobs whose pods are all gone go back to the queue with a new attempt.
5. At a new daemon's first reconcile, then every `strays.HELD_JOBS_SWEEP_S`: a held Job that
   runs while its job is not live is suspended (`scheduler.daemon.strays`).
"""

from __future__ import annotations

import functools
import logging
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from django.db import connection

from common.compiled import fetch_by_ids, fetch_compiled
from scheduler.backends.base import PodPhase
from scheduler.daemon import strays, workloads
from scheduler.daemon.cluster import Cluster
from scheduler.daemon.companions import faults as companion_faults
from scheduler.daemon.companions.binding import keep_companions
from scheduler.daemon.judge import (
    Verdict,
    apply_verdicts,
    judge,
    release_lost_claims,
    requeue_preempted,
)
from scheduler.daemon.state import Clock, Every, Limits, NodeMemory
from scheduler.daemon.store import release
from scheduler.jobs.transitions import Change, job_timestamps, transition
from scheduler.leader import Lease
from scheduler.models import (
    FINAL_STATES,
    Allocation,
    AllocationDevice,
    GpuDevice,
    Job,
    JobState,
    Node,
)
from scheduler.snapshot.cache import SnapshotCache, reread, rows_by_version, running_job_rows

log = logging.getLogger("gantry.daemon")
S = JobState
# Every preempted job with nothing left running is looked for this often (daemon clock, s).
REQUEUE_SWEEP_S = 2.0
ALLOC_FIELDS = (
    "id",
    "job_id",
    "attempt",
    "replica",
    "pod_name",
    "namespace",
    "elastic",
    "end_reason",
    "node__name",
    "node__ready",
    "node__present",
    "bound_at",
    # for the snapshot that follows (scheduler.snapshot.build.build_snapshot)
    "flavor",
    "started_at",
)


@dataclass
class ReconcileStats:
    released: int = 0
    orphans: int = 0
    changed: int = 0
    # The allocations still active when reconcile is done: only this (fenced) daemon
    # creates or ends allocations, so the cycle's snapshot takes them from here; and the
    # rows of their jobs, read again where reconcile wrote them.
    active: list[dict[str, Any]] = field(default_factory=list)
    rows: dict[int, dict[str, Any]] = field(default_factory=dict)
    # Jobs whose pods were seen running (binding -> running), written after the binds
    # (`record_starts`, `write_starts`), and the time they were seen at.
    starts: list[Change] = field(default_factory=list)
    seen_at: datetime | None = None


class Reconciler:
    """Reconcile with what it remembers between cycles: the nodes seen down (in `nodes`)
    and when it last swept every preempted job."""

    def __init__(self, nodes: NodeMemory, limits: Limits, *, watch_held: bool = False) -> None:
        self.nodes, self.limits = nodes, limits
        self.requeue_sweep = Every(REQUEUE_SWEEP_S)
        self.held_jobs_sweep = Every(strays.HELD_JOBS_SWEEP_S)
        # With `watch_held`, the sweep reads the held objects from watches (made at its first
        # read, where the backend offers them; `close` ends them), not a list every sweep.
        self.watch_held = watch_held
        self.held: strays.WatchedReads | None = None
        # The ended pods left to their users' objects (`workloads.keeps_pods`), remembered
        # while they are listed: judged once, not read against their jobs every cycle while
        # they stay (until their objects' controllers or TTLs remove them).
        self.left: set[tuple[str, str]] = set()

    def close(self) -> None:
        if self.held is not None:
            self.held.close()
            self.held = None

    def _held(self, cluster: Cluster, clock: Clock) -> strays.WatchedReads | None:
        backend = cluster.backend
        if not self.watch_held or not isinstance(backend, strays.HeldWatching):
            return None
        if self.held is None:
            self.held = backend.watch_held(clock=clock.now, relist_s=strays.HELD_RELIST_S)
        return self.held

    def run(
        self, cluster: Cluster, lease: Lease, cache: SnapshotCache, clock: Clock
    ) -> ReconcileStats:
        stats = ReconcileStats()
        # With the rows of their jobs: the snapshot's (shared with its cache: read-only
        # here), handed on to it below.
        active = active_allocations(cache)
        allocs, jobs = active.allocations, active.jobs
        # Unhealthy devices are few (usually none): found with the allocations, then their
        # live shares.
        bad_gpu = (
            set(
                AllocationDevice.objects.filter(
                    released=False, device_id__in=active.unhealthy
                ).values_list("allocation_id", flat=True)
            )
            if active.unhealthy
            else set()
        )
        # The pods last, after the reads: a pod that ended meanwhile is seen by this cycle, not
        # the next. (Only this fenced daemon makes allocations, so none appears in between.)
        pods = {p.name: p for p in cluster.backend.list_pods()}
        now = clock.dt()
        # 0. the pods that users' Jobs made for their admitted attempts (issue 37)
        allocs = workloads.adopt(allocs, jobs, pods, cluster, lease)
        # ... and the pods their operators make beside the replicas, bound with replica 0
        known = {a["pod_name"] for a in allocs} | keep_companions(allocs, jobs, pods, cluster)
        deadline = timedelta(seconds=self.limits.binding_timeout_s)
        judged = companion_faults.with_gone(cluster.backend, pods)
        faults = companion_faults.companion_faults(allocs, jobs, judged, now, deadline)
        # 1. orphans (a user's Job's own pods left to its controller)
        self.left &= {(p.namespace, p.name) for p in pods.values() if workloads.pod_ended(p)}
        unheld = [
            p
            for p in pods.values()
            if p.name not in known and not p.deleting and (p.namespace, p.name) not in self.left
        ]
        theirs = workloads.left_to_their_jobs(unheld) if unheld else set()
        self.left |= {
            (p.namespace, p.name) for p in unheld if p.name in theirs and workloads.pod_ended(p)
        }
        orphans = [(p.namespace, p.name, 0) for p in unheld if p.name not in theirs]
        for _, name, _ in orphans:
            log.warning("pod %s has no allocation: deleting it", name)
        cluster.delete_pods(orphans)
        stats.orphans = len(orphans)
        # 2. stopping allocations; 3. judge the rest per job
        live: dict[int, list[dict[str, Any]]] = defaultdict(list)
        to_release: list[int] = []
        deletions: list[tuple[str, str, int]] = []
        stopped: list[dict[str, Any]] = []
        preempted: dict[int, set[int]] = defaultdict(set)  # preempted job -> its allocations
        lost = _lost_nodes(self.nodes.down, allocs, clock.now(), self.limits.node_lost_grace_s)
        for a in allocs:
            job = jobs[a["job_id"]]
            if job["state"] == S.PREEMPTED:
                preempted[a["job_id"]].add(a["id"])
            stopping = (
                a["end_reason"]
                or a["attempt"] != job["attempt"]
                or job["state"] in FINAL_STATES
                or job["state"] == S.PREEMPTED
            )
            if not stopping:
                live[a["job_id"]].append(a)
                continue
            stopped.append(a)
            pod, on_lost_node = pods.get(a["pod_name"]), a["node__name"] in lost
            if pod is None or pod.phase in (PodPhase.SUCCEEDED, PodPhase.FAILED) or on_lost_node:
                to_release.append(a["id"])
            if (
                pod is not None
                and (on_lost_node or not pod.deleting)
                and not workloads.keeps_pods(job, pod)
            ):
                deletions.append((a["namespace"], a["pod_name"], 0 if on_lost_node else 30))
        verdicts = {
            job_id: verdict
            for job_id, group in live.items()
            if not (verdict := judge(jobs[job_id], group, pods, bad_gpu, now, deadline)).idle
        }
        told = _judge_faults(faults, live, verdicts)
        adopting = {bind: v for v in verdicts.values() for bind in v.adopt}
        for bind, error in cluster.bind_pods(list(adopting)).items():
            log.warning("adopting pod %s failed: %s", bind[1], error)
            adopting[bind].adopted, adopting[bind].release_claim = False, True
        workloads.suspend_stopped(stopped, jobs, cluster)  # before their pods go
        cluster.delete_pods(deletions)
        with lease.writing():
            stats.released = release(to_release, now, "pod gone")
            written, ended, finished, stats.starts = apply_verdicts(jobs, live, pods, verdicts, now)
            stats.changed = len(written)
            companion_faults.tell([f for f in told if f.job_id not in written], jobs, now)
            gone = {*to_release, *finished}
            # Preempted jobs whose last allocation ended now; every few seconds, all of them
            # (a job preempted with nothing left running is requeued by the sweep).
            freed = [j for j, ids in preempted.items() if ids <= gone]
            if self.requeue_sweep.due(clock.now()):
                stats.changed += requeue_preempted(now) + release_lost_claims(now)
            elif freed:
                stats.changed += requeue_preempted(now, freed)
        stats.seen_at = now
        stats.active = [a for a in allocs if a["id"] not in gone]
        stats.rows = _holders(stats.active, jobs, written, cache)
        # The Jobs whose jobs failed now (a success completes its Job on its own): suspended,
        # their pods left to their controllers.
        failed = [a for a in ended if not verdicts[a["job_id"]].succeeded]
        workloads.suspend_stopped(failed, jobs, cluster, ended=True)
        if self.held_jobs_sweep.due(clock.now()):
            # whatever left a held Job running
            strays.suspend_strays(cluster, self._held(cluster, clock))
        kept = {a["id"] for a in failed if workloads.workload_of(jobs[a["job_id"]])}
        cluster.delete_pods(
            [
                (a["namespace"], a["pod_name"], 30)
                for a in ended
                if (p := pods.get(a["pod_name"])) is not None
                and not p.deleting
                and a["id"] not in kept
                # an ended pod of a user's object is left to it (its logs are the user's)
                and not (workloads.workload_of(jobs[a["job_id"]]) and workloads.pod_ended(p))
            ],
        )
        return stats


def _judge_faults(
    faults: Mapping[int, companion_faults.Fault],
    live: Mapping[int, list[dict[str, Any]]],
    verdicts: dict[int, Verdict],
) -> list[companion_faults.Fault]:
    """A job's faulty companion (step 3's, beside its replicas' pods): the attempt fails
    with it where no operator would end the object (`Fault.ends`), unless its replicas
    already decided (failed, or succeeded); the faults left to tell are returned."""
    told = []
    for job_id, fault in faults.items():
        if job_id not in live:
            continue
        verdict = verdicts.get(job_id) or Verdict()
        if not fault.ends:
            told.append(fault)
        elif not (verdict.failure or verdict.succeeded):
            verdict.failure, verdict.start = (fault.reason, fault.text), False
            verdicts[job_id] = verdict
    return told


def _lost_nodes(
    since: dict[str, float], allocs: Sequence[Mapping[str, Any]], now: float, grace_s: float
) -> set[str]:
    """The nodes of `allocs` NotReady or gone for at least `grace_s` (daemon clock; `since`
    remembers since when, and forgets a node seen back)."""
    down = {a["node__name"] for a in allocs if not (a["node__ready"] and a["node__present"])}
    for name in [n for n in since if n not in down]:
        del since[name]
    for name in down:
        since.setdefault(name, now)
    return {n for n, at in since.items() if now - at >= grace_s}


def _holders(
    active: Sequence[Mapping[str, Any]],
    jobs: Mapping[int, dict[str, Any]],
    written: set[int],
    cache: SnapshotCache,
) -> dict[int, dict[str, Any]]:
    """The rows of the jobs holding `active`: as read, or read again if reconcile wrote
    them."""
    holders = {a["job_id"] for a in active}
    rows = {i: jobs[i] for i in holders if i in jobs and i not in written}
    again = sorted(holders & written)
    rows.update(reread(again, cache) if again else {})
    return rows


@dataclass
class Starts:
    """What `record_starts` wrote: the jobs moved and their new row versions (PostgreSQL)."""

    done: list[int] = field(default_factory=list)
    versions: dict[int, int] = field(default_factory=dict)


def record_starts(rec: ReconcileStats) -> Starts:
    """binding -> running for the jobs whose pods reconcile saw running, in the caller's
    fenced transaction (the cycle's commit of its binds, when it has one: a transaction
    fewer). Returns what it wrote, for `write_starts` once committed."""
    out = Starts()
    if rec.starts and rec.seen_at is not None:
        out.done = list(transition(rec.starts, rec.seen_at, versions=out.versions).done)
    return out


def write_starts(
    rec: ReconcileStats, lease: Lease, cache: SnapshotCache, recorded: Starts | None = None
) -> int:
    """binding -> running for the jobs whose pods reconcile saw running, fenced, after the
    cycle's binds: nothing waits on it (the snapshot counts a job's devices as held in
    either state), while the devices that reconcile freed wait for the binds. A job that
    changed meanwhile (preempted in this cycle) is skipped by the compare-and-swap.
    `recorded`: what the commit's transaction wrote of them (`record_starts`), committed;
    without it, written here in a transaction of their own. Returns the jobs written; the
    cache takes their new rows."""
    if not rec.starts or rec.seen_at is None:
        return 0
    if recorded is None:
        with lease.writing():
            recorded = record_starts(rec)
    fields = {"state": S.RUNNING, "reason": "", **job_timestamps(S.RUNNING, rec.seen_at)}
    cache.remember(recorded.versions, fields)
    return len(recorded.done)


# An active allocation's version: its row's and its node's (PostgreSQL row versions, new on
# every UPDATE), so a change to either, by any writer, reads the row again; its job's id
# and version, for the rows of the jobs holding allocations (one read for both); and on
# every row, the unhealthy devices (evaluated once; null when there are none).
ACTIVE_VERSIONS_SQL = (
    "SELECT a.id, a.xmin::text::bigint, n.xmin::text::bigint, a.job_id, j.xmin::text::bigint,"
    " (SELECT array_agg(d.id ORDER BY d.id) FROM {device} d WHERE NOT d.healthy)"
    " FROM {allocation} a JOIN {node} n ON n.id = a.node_id JOIN {job} j ON j.id = a.job_id"
    " WHERE a.ended_at IS NULL"
)


@functools.cache
def _active_versions_sql() -> str:
    return ACTIVE_VERSIONS_SQL.format(
        allocation=Allocation._meta.db_table,
        node=Node._meta.db_table,
        job=Job._meta.db_table,
        device=GpuDevice._meta.db_table,
    )


@dataclass
class Active:
    """The active allocations (ALLOC_FIELDS), oldest first, and the rows of the jobs holding
    them (job id -> row, as `running_job_rows` reads them). Shared with the cache:
    read-only."""

    allocations: list[dict[str, Any]]
    jobs: dict[int, dict[str, Any]]
    unhealthy: list[int] = field(default_factory=list)  # devices, when allocations are active


def active_allocations(cache: SnapshotCache) -> Active:
    """The active allocations and their jobs' rows (`Active`). On PostgreSQL the ids and
    versions of both in one read first, then whole rows only for those the cache lacks or
    holds an older version of: an allocation is read when it is made and when it or its
    node changes, a job when it changes, not every cycle."""
    if connection.vendor != "postgresql":
        allocations = list(
            Allocation.objects.filter(ended_at__isnull=True).order_by("id").values(*ALLOC_FIELDS)
        )
        sick = fetch_compiled(
            ("unhealthy devices",), lambda: GpuDevice.objects.filter(healthy=False).values("id")
        )
        jobs = {r["id"]: r for r in running_job_rows(cache)}
        return Active(allocations, jobs, [row[0] for row in sick] if allocations else [])
    with connection.cursor() as cursor:
        cursor.execute(_active_versions_sql())
        found = cursor.fetchall()
    versions = {i: (a, n) for i, a, n, _, _, _ in found}
    known = cache.allocations
    stale = [i for i, v in versions.items() if (kept := known.get(i)) is None or kept[0] != v]
    if stale:
        fresh = fetch_by_ids(
            ("active allocations",),
            lambda some: Allocation.objects.filter(id__any=some, ended_at__isnull=True).values(
                *ALLOC_FIELDS
            ),
            stale,
        )
        for row in fresh:
            known[row["id"]] = (versions[row["id"]], row)
    for gone in [i for i in known if i not in versions]:
        del known[gone]
    holders = {job: version for _, _, _, job, version, _ in found}
    jobs = {r["id"]: r for r in rows_by_version(list(holders.items()), cache)}
    unhealthy = [int(d) for d in found[0][5] or ()] if found else []
    return Active([known[i][1] for i in sorted(versions) if i in known], jobs, unhealthy)
