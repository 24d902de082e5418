"""Reconcile, level-based: what the cluster reports wins.

Called at the start of every cycle, when no claim of this daemon is in flight, so an
`admitted` job found here was claimed by a daemon that died before committing its binds.

1. Pods without an active allocation are orphans: reported and deleted.
2. Allocations that are stopping (preempted, scaled down, an older attempt, a job that
   ended): their pod is deleted; once it is gone the allocation is released. A pod on a node
   NotReady or gone for the daemon's `node_lost_grace_s` counts as gone (no kubelet will
   confirm its deletion: Terminating for ever): it is force-deleted and released, as
   Kubernetes' pod garbage collector does with the pods of lost nodes.
3. Each job holding allocations is judged on its pods: adopt a crashed claim (all pods exist:
   bind the unbound ones) or release it; running when its pods run (written after the
   cycle's binds, `write_starts`); succeeded when they have; an attempt failed on a failed
   or vanished pod, a lost node or an unhealthy GPU (retried per the job's policy), or a pod
   bound but not started within the daemon's `binding_timeout_s` (with the cause the cluster
   reports; retried per the job's policy); failed past its max runtime.
4. Preempted jobs whose pods are all gone go back to the queue with a new attempt.
"""

from __future__ import annotations

import functools
import logging
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from django.db import connection, transaction
from django.db.models import Count

from scheduler.adapters import (
    SnapshotCache,
    fetch_compiled,
    holds_allocation,
    release,
    reread,
    running_job_rows,
)
from scheduler.backends.base import BackendError, BindConflict, FailureReason, PodPhase, PodStatus
from scheduler.daemon_apply import binder, call_with_retry, delete_pods
from scheduler.models import (
    FINAL_STATES,
    Allocation,
    AllocationDevice,
    GpuDevice,
    Job,
    JobEvent,
    JobState,
    Node,
)
from scheduler.transitions import Change, transition_many

if TYPE_CHECKING:
    from scheduler.daemon import Daemon

log = logging.getLogger("gantry.daemon")
S = JobState
F = FailureReason
# Not the job's fault: retried whatever its policy, up to INFRA_ATTEMPTS attempts.
INFRA = frozenset({F.NODE_LOST, F.EVICTED, F.PREEMPTED, F.REJECTED})
INFRA_ATTEMPTS = 10
# Every preempted job with nothing left running is looked for this often (daemon clock, s).
REQUEUE_SWEEP_S = 2.0
# Retrying cannot help.
FINAL = frozenset({F.DEADLINE_EXCEEDED, F.IMAGE_PULL})
WHY = {
    F.START_TIMEOUT: "its pods did not start",
    F.OOM_KILLED: "OOMKilled: a container ran out of memory",
    F.EVICTED: "Evicted by the node (resource pressure)",
    F.IMAGE_PULL: "image pull failure: the image could not be pulled",
    F.CRASH_LOOP: "CrashLoopBackOff: the container keeps crashing",
    F.DEADLINE_EXCEEDED: "deadline exceeded",
    F.NODE_LOST: "node lost",
    F.PREEMPTED: "preempted by the cluster",
    F.REJECTED: "rejected by the kubelet",
    F.ERROR: "the job exited with an error",
}
STARTED = "Running: all pods started."
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
    # for the snapshot that follows (scheduler.adapters.build_snapshot)
    "flavor",
    "started_at",
)


@dataclass
class Verdict:
    """What reconcile decided for one job."""

    start: bool = False  # binding -> running
    adopt: list[tuple[str, str, str]] = field(default_factory=list)  # ns, pod, node to bind
    adopted: bool = False
    release_claim: bool = False
    succeeded: bool = False
    failure: tuple[FailureReason, str] | None = None


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
    # (`write_starts`), and the time they were seen at.
    starts: list[Change] = field(default_factory=list)
    seen_at: datetime | None = None


def reconcile(daemon: Daemon) -> ReconcileStats:
    stats = ReconcileStats()
    allocs = active_allocations(daemon.cache)
    # The snapshot's rows (shared with its cache: read-only here), handed on to it below.
    jobs = {r["id"]: r for r in running_job_rows(daemon.cache)}
    # Unhealthy devices are few (usually none): find them first, then their live shares.
    unhealthy = [
        row[0]
        for row in fetch_compiled(
            ("unhealthy devices",), lambda: GpuDevice.objects.filter(healthy=False).values("id")
        )
    ]
    bad_gpu = (
        set(
            AllocationDevice.objects.filter(released=False, device_id__in=unhealthy).values_list(
                "allocation_id", flat=True
            )
        )
        if unhealthy
        else set()
    )
    # The pods last, after the reads: a pod that ended meanwhile is seen by this cycle, not
    # the next. (Only this fenced daemon makes allocations, so none appears in between.)
    pods = {p.name: p for p in daemon.backend.list_pods()}
    now = daemon.now_dt()
    known = {a["pod_name"] for a in allocs}
    # 1. orphans
    orphans = [
        (p.namespace, p.name, 0) for p in pods.values() if p.name not in known and not p.deleting
    ]
    for _, name, _ in orphans:
        log.warning("pod %s has no allocation: deleting it", name)
    delete_pods(daemon, orphans)
    stats.orphans = len(orphans)
    # 2. stopping allocations; 3. judge the rest per job
    live: dict[int, list[dict[str, Any]]] = defaultdict(list)
    to_release: list[int] = []
    deletions: list[tuple[str, str, int]] = []
    preempted: dict[int, set[int]] = defaultdict(set)  # preempted job -> its allocations
    lost = _lost_nodes(daemon, allocs)
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
        pod, on_lost_node = pods.get(a["pod_name"]), a["node__name"] in lost
        if pod is None or pod.phase in (PodPhase.SUCCEEDED, PodPhase.FAILED) or on_lost_node:
            to_release.append(a["id"])
        if pod is not None and (on_lost_node or not pod.deleting):
            deletions.append((a["namespace"], a["pod_name"], 0 if on_lost_node else 30))
    deadline = timedelta(seconds=daemon.binding_timeout_s)
    verdicts = {
        job_id: judge(jobs[job_id], group, pods, bad_gpu, now, deadline)
        for job_id, group in live.items()
    }
    for verdict in verdicts.values():
        for namespace, name, node in verdict.adopt:
            try:
                call_with_retry(daemon, binder(daemon, namespace, name, node), "bind")
            except (BackendError, BindConflict) as error:
                log.warning("adopting pod %s failed: %s", name, error)
                verdict.adopted, verdict.release_claim = False, True
    delete_pods(daemon, deletions)
    with transaction.atomic():
        daemon.lease.fence()
        stats.released = release(to_release, now, "pod gone")
        written, ended, finished, stats.starts = _apply(jobs, live, pods, verdicts, now)
        stats.changed = len(written)
        gone = {*to_release, *finished}
        # Preempted jobs whose last allocation ended now; every few seconds, all of them
        # (a job preempted with nothing left running is requeued by the sweep).
        freed = [j for j, ids in preempted.items() if ids <= gone]
        at = daemon.clock()
        if at - daemon.requeue_swept_at >= REQUEUE_SWEEP_S:
            daemon.requeue_swept_at = at
            stats.changed += _requeue_preempted(now) + release_lost_claims(now)
        elif freed:
            stats.changed += _requeue_preempted(now, freed)
    stats.seen_at = now
    stats.active = [a for a in allocs if a["id"] not in gone]
    stats.rows = _holders(stats.active, jobs, written, daemon.cache)
    delete_pods(
        daemon,
        [
            (a["namespace"], a["pod_name"], 30)
            for a in ended
            if (p := pods.get(a["pod_name"])) is not None and not p.deleting
        ],
    )
    return stats


def _lost_nodes(daemon: Daemon, allocs: Sequence[Mapping[str, Any]]) -> set[str]:
    """The nodes of `allocs` NotReady or gone for at least the daemon's `node_lost_grace_s`
    (daemon clock; `Daemon.nodes_down` remembers since when, and forgets a node seen back)."""
    now, since = daemon.clock(), daemon.nodes_down
    down = {a["node__name"] for a in allocs if not (a["node__ready"] and a["node__present"])}
    for name in [n for n in since if n not in down]:
        del since[name]
    for name in down:
        since.setdefault(name, now)
    return {n for n, at in since.items() if now - at >= daemon.node_lost_grace_s}


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


def write_starts(daemon: Daemon, rec: ReconcileStats) -> int:
    """binding -> running for the jobs whose pods reconcile saw running, fenced, after the
    cycle's binds: nothing waits on it (the snapshot counts a job's devices as held in
    either state), while the devices that reconcile freed wait for the binds. A job that
    changed meanwhile (preempted in this cycle) is skipped by the compare-and-swap.
    Returns the jobs written; the cache takes their new rows."""
    if not rec.starts or rec.seen_at is None:
        return 0
    versions: dict[int, int] = {}
    with transaction.atomic():
        daemon.lease.fence()
        done = transition_many(rec.starts, rec.seen_at, versions).done
    fields = {"state": S.RUNNING, "started_at": rec.seen_at, "reason": ""}
    daemon.cache.remember(versions, fields)
    return len(done)


# An active allocation's version: its row's and its node's (PostgreSQL row versions, new on
# every UPDATE), so a change to either, by any writer, reads the row again.
ACTIVE_VERSIONS_SQL = (
    "SELECT a.id, a.xmin::text::bigint, n.xmin::text::bigint FROM {allocation} a"
    " JOIN {node} n ON n.id = a.node_id WHERE a.ended_at IS NULL"
)


@functools.cache
def _active_versions_sql() -> str:
    return ACTIVE_VERSIONS_SQL.format(
        allocation=Allocation._meta.db_table, node=Node._meta.db_table
    )


def active_allocations(cache: SnapshotCache) -> list[dict[str, Any]]:
    """The active allocations (ALLOC_FIELDS), oldest first. On PostgreSQL their ids and
    versions first, then whole rows only for those the cache lacks or holds an older
    version of: an allocation is read when it is made and when it or its node changes,
    not every cycle. The rows are shared with the cache: read-only."""
    if connection.vendor != "postgresql":
        return list(
            Allocation.objects.filter(ended_at__isnull=True).order_by("id").values(*ALLOC_FIELDS)
        )
    with connection.cursor() as cursor:
        cursor.execute(_active_versions_sql())
        versions = {i: (a, n) for i, a, n in cursor.fetchall()}
    known = cache.allocations
    stale = [i for i, v in versions.items() if (kept := known.get(i)) is None or kept[0] != v]
    if stale:
        fresh = Allocation.objects.filter(id__any=stale, ended_at__isnull=True)
        for row in fresh.values(*ALLOC_FIELDS):
            known[row["id"]] = (versions[row["id"]], row)
    for gone in [i for i in known if i not in versions]:
        del known[gone]
    return [known[i][1] for i in sorted(versions) if i in known]


def judge(
    job: Mapping[str, Any],
    allocs: list[dict[str, Any]],
    pods: Mapping[str, PodStatus],
    bad_gpu: set[int],
    now: datetime,
    binding_timeout: timedelta,
) -> Verdict:
    verdict = Verdict()
    mine = [pods.get(a["pod_name"]) for a in allocs]
    if job["state"] == S.ADMITTED:
        if any(p is None for p in mine):
            verdict.release_claim = True
            return verdict
        verdict.adopt = [
            (a["namespace"], a["pod_name"], a["node__name"])
            for a, p in zip(allocs, mine, strict=True)
            if p is not None and p.node is None
        ]
        verdict.adopted = True
        return verdict
    for a, pod in zip(allocs, mine, strict=True):
        if not a["node__ready"] or not a["node__present"]:
            verdict.failure = (F.NODE_LOST, f"node {a['node__name']} is NotReady or gone")
        elif a["id"] in bad_gpu:
            verdict.failure = (F.NODE_LOST, f"a GPU of {a['node__name']} turned unhealthy")
        elif pod is None:
            verdict.failure = (F.NODE_LOST, f"pod {a['pod_name']} vanished")
        elif pod.phase == PodPhase.FAILED:
            verdict.failure = (pod.reason or F.ERROR, pod.message or "")
        elif _never_started(a, pod, now, binding_timeout):
            late = f"{binding_timeout.total_seconds():.0f} s after binding"
            cause = pod.waiting or "the cluster reports no cause"
            verdict.failure = (F.START_TIMEOUT, f"pod {pod.name} not started {late}: {cause}")
        if verdict.failure:
            return verdict
    phases = [p.phase for p in mine if p is not None]
    core = [
        p.phase for a, p in zip(allocs, mine, strict=True) if p is not None and not a["elastic"]
    ]
    verdict.start = job["state"] == S.BINDING and any(
        ph in (PodPhase.RUNNING, PodPhase.SUCCEEDED) for ph in phases
    )
    verdict.succeeded = bool(core) and all(ph == PodPhase.SUCCEEDED for ph in core)
    # `started_at` is the current run's only once it runs: a job bound again after a
    # preemption still holds its earlier run's until its new pods start.
    limit, started = job["max_runtime_s"], job["started_at"]
    running = job["state"] == S.RUNNING
    if (
        running
        and not verdict.succeeded
        and limit
        and started
        and now - started > timedelta(seconds=limit)
    ):
        verdict.failure = (F.DEADLINE_EXCEEDED, f"ran longer than its max runtime of {limit} s")
    return verdict


def _never_started(
    allocation: Mapping[str, Any], pod: PodStatus, now: datetime, timeout: timedelta
) -> bool:
    """A pod of the job's gang still Pending `timeout` after it was bound. Elastic replicas
    are left alone: the job runs without them."""
    bound = allocation["bound_at"]
    return (
        pod.phase == PodPhase.PENDING
        and not allocation["elastic"]
        and bound is not None
        and now - bound > timeout
    )


def _apply(
    jobs: Mapping[int, Any],
    live: Mapping[int, list[dict[str, Any]]],
    pods: Mapping[str, PodStatus],
    verdicts: Mapping[int, Verdict],
    now: datetime,
) -> tuple[set[int], list[dict[str, Any]], list[int], list[Change]]:
    """Write the verdicts, except the starts (binding -> running), returned for
    `write_starts`. Returns the ids of the jobs written, the allocations of the attempts
    that ended, those of them released, and the starts."""
    # Pods seen started and finished at once (short jobs): one write, both events.
    both = {j for j, v in verdicts.items() if v.start and v.succeeded}
    starts = [
        Change(j, (S.BINDING,), S.RUNNING, message=STARTED)
        for j, v in verdicts.items()
        if v.start and j not in both
    ]
    adopted = [j for j, v in verdicts.items() if v.adopted and not v.release_claim]
    Allocation.objects.filter(job_id__any=adopted, ended_at__isnull=True).update(bound_at=now)
    changes = [
        Change(
            j,
            (S.ADMITTED,),
            S.BINDING,
            message="Bound: adopted pods of a claim whose scheduler stopped before recording them.",
        )
        for j in adopted
    ]
    failures = {j: v.failure for j, v in verdicts.items() if v.failure}
    counts = dict(
        JobEvent.objects.filter(job_id__any=list(failures), kind="attempt_failed")
        .values_list("job_id")
        .annotate(n=Count("id"))
    )
    ends: list[int] = []
    for job_id, verdict in verdicts.items():
        job = jobs[job_id]
        if verdict.release_claim:
            ends.append(job_id)
            changes.append(
                Change(
                    job_id,
                    (S.ADMITTED,),
                    S.QUEUED,
                    new_attempt=True,
                    message="Claim released: the scheduler that made it stopped "
                    "before its pods were created; back to the queue.",
                    reason="claim released after a scheduler restart",
                )
            )
        elif verdict.failure:
            ends.append(job_id)
            changes.append(_failure_change(job, *verdict.failure, counts.get(job_id, 0), now))
        elif verdict.succeeded:
            ends.append(job_id)
            if job_id in both:
                changes.append(
                    Change(
                        job_id,
                        (S.BINDING,),
                        S.SUCCEEDED,
                        message="Succeeded.",
                        via=S.RUNNING,
                        via_message=STARTED,
                    )
                )
            else:
                changes.append(Change(job_id, (S.RUNNING,), S.SUCCEEDED, message="Succeeded."))
    # A change not applied (the job changed meanwhile, or its row is locked) is judged
    # again at the next cycle: its allocations stay as they are until then.
    done = transition_many(changes, now).done
    ended = [a for j in ends if j in done for a in live[j]]
    finished = [
        a["id"]
        for a in ended
        if (p := pods.get(a["pod_name"])) is None
        or p.phase in (PodPhase.SUCCEEDED, PodPhase.FAILED)
    ]
    release(finished, now, "attempt ended")
    released = set(finished)
    stopping = [a["id"] for a in ended if a["id"] not in released]
    Allocation.objects.filter(id__any=stopping).update(end_reason="attempt ended")
    return set(done), ended, finished, starts


def _failure_change(
    job: Mapping[str, Any], reason: FailureReason, detail: str, failures: int, now: datetime
) -> Change:
    retry = job["spec__retry"] or {}
    limit, backoff = int(retry.get("limit", 0)), int(retry.get("backoff_s", 30))
    why = WHY.get(reason, str(reason)) + (f" ({detail})" if detail else "")
    infra = reason in INFRA and job["attempt"] + 1 < INFRA_ATTEMPTS
    if reason not in FINAL and (infra or failures < limit):
        delay = 0 if infra else min(3600, backoff * 2**failures)
        tries = "" if infra else f" (retry {failures + 1} of {limit})"
        return Change(
            job["id"],
            (S.BINDING, S.RUNNING),
            S.QUEUED,
            new_attempt=True,
            not_before=now + timedelta(seconds=delay),
            kind="attempt_failed",
            message=f"Attempt {job['attempt']} failed: {why}; retrying in {delay} s{tries}.",
            reason=f"attempt {job['attempt']} failed: {why}; retry in {delay} s",
            data={"reason": str(reason)},
        )
    return Change(
        job["id"],
        (S.BINDING, S.RUNNING),
        S.FAILED,
        kind="attempt_failed",
        message=f"Failed: {why}.",
        reason=why,
        data={"reason": str(reason)},
    )


def release_lost_claims(now: datetime) -> int:
    """Admitted jobs holding no active allocation go back to the queue: a claim whose
    allocation was never made, or was ended while its job's row was locked. Reconcile runs
    when no claim of this daemon is in flight, so none of them is still being made."""
    lost = Job.objects.filter(state=S.ADMITTED).exclude(holds_allocation())
    changes = [
        Change(
            i,
            (S.ADMITTED,),
            S.QUEUED,
            new_attempt=True,
            message="Claim released: it held no allocation; back to the queue.",
            reason="claim released: it held no allocation",
        )
        for i in lost.values_list("id", flat=True)
    ]
    return len(transition_many(changes, now).done)


def _requeue_preempted(now: datetime, among: Sequence[int] | None = None) -> int:
    """Preempted jobs (of `among`, or all) with nothing left running go back to the queue,
    attempt raised."""
    preempted = Job.objects.filter(state=S.PREEMPTED)
    if among is not None:
        preempted = preempted.filter(id__any=among)
    ids = list(preempted.exclude(holds_allocation()).values_list("id", "reason"))
    changes = [
        Change(
            i,
            (S.PREEMPTED,),
            S.QUEUED,
            new_attempt=True,
            reason=r,
            message="Back in the queue after preemption.",
        )
        for i, r in ids
    ]
    return len(transition_many(changes, now).done)
