"""Phases B and C of a cycle: create and bind the claimed pods in the cluster, then record
what bound (admitted -> binding) and return what did not to the queue."""

from __future__ import annotations

import logging
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from django.db.models import Count

from common.words import counted
from scheduler.backends.base import BackendError, BindConflict, PodRequest
from scheduler.daemon.apply import Plan
from scheduler.daemon.cluster import Cluster
from scheduler.daemon.state import Hook, Limits
from scheduler.daemon.store import mark_bound, release
from scheduler.jobs.transitions import Change, transition
from scheduler.leader import Lease
from scheduler.models import (
    Job,
    JobEvent,
    JobState,
)
from scheduler.snapshot.cache import SnapshotCache

log = logging.getLogger("gantry.daemon")
S = JobState


_BINDING = {"state": S.BINDING, "reason": ""}


BIND_FAILED = "bind_failed"  # the kind of a failed bind's event, counted for its limit


@dataclass
class Outcome:
    bound: dict[int, list[int]] = field(default_factory=dict)
    failed: dict[int, str] = field(default_factory=dict)  # job id -> why
    # Pods whose name something else already holds: not ours, so never deleted by us.
    foreign: set[tuple[str, str]] = field(default_factory=set)


def bind_plan(cluster: Cluster, plan: Plan, hook: Hook) -> Outcome:
    out = Outcome()
    cluster.delete_pods(plan.deletions)
    created: dict[int, list[PodRequest]] = defaultdict(list)
    for job_id, pods in plan.pods.items():
        try:
            for pod in pods:
                cluster.create(pod)
                created[job_id].append(pod)
        except BackendError as error:
            out.failed[job_id] = f"creating pods failed: {error}"
        except BindConflict as conflict:
            # Another object holds the deterministic name. The requeue raises the attempt,
            # so the next try uses a fresh name; the foreign pod is left alone.
            out.failed[job_id] = f"creating pods failed: {conflict}"
            out.foreign.add((pod.namespace, pod.name))
    hook("pods_created")
    for job_id, pods in created.items():
        if job_id in out.failed:
            continue
        try:
            for pod in pods:
                cluster.bind(pod.namespace, pod.name, pod.node)
            out.bound[job_id] = plan.allocations[job_id]
        except BindConflict as conflict:
            where = f" (bound to {conflict.bound_node})" if conflict.bound_node else ""
            out.failed[job_id] = f"bind conflict{where}: {conflict}"
        except BackendError as error:
            out.failed[job_id] = f"binding failed: {error}"
    hook("bound")
    return out


def commit_binds(
    plan: Plan,
    out: Outcome,
    *,
    cluster: Cluster,
    lease: Lease,
    cache: SnapshotCache,
    limits: Limits,
    now: datetime,
    hook: Hook,
    within: Callable[[], object] = lambda: None,
) -> None:
    """Record what bound (admitted -> binding) and return what did not to the queue, then
    call `within` in the same fenced transaction (the cycle's other writes after the binds).
    A claim's allocations are released only with its state change: a job whose row another
    session holds locked stays admitted and keeps them (its pods were deleted, so the next
    reconcile releases the claim), never admitted without an allocation. Nothing bound or
    failed: no transaction, and `within` is not called."""
    failed_pods = [
        (p.namespace, p.name, 0)
        for j in out.failed
        for p in plan.pods.get(j, [])
        if (p.namespace, p.name) not in out.foreign
    ]
    cluster.delete_pods(failed_pods)
    if not (out.bound or out.failed):
        return  # nothing was bound or failed: nothing to record
    bound_jobs = [j for j in out.bound if j in plan.claimed]
    written: dict[int, int] = {}
    with lease.writing():
        bound_ids = [a for ids in out.bound.values() for a in ids]
        mark_bound(bound_ids, now)
        # A job skipped here (row locked) stays admitted with its pods bound: adopted by
        # the next reconcile.
        bound = "Bound: pods created and bound to their nodes."
        binds = [Change(j, (S.ADMITTED,), S.BINDING, message=bound) for j in bound_jobs]
        transition(binds, now, versions=written)
        moved = _requeue_failed_binds(plan, out, now, limits.bind_attempts)
        # An elastic replica that did not bind is simply not grown this time.
        freed = [j for j in out.failed if j not in plan.claimed or j in moved]
        release([a for j in freed for a in plan.allocations.get(j, [])], now, "bind failed")
        within()
        hook("before_commit")
    # Committed; a job bound in part and failed in part was written twice: not remembered.
    cache.remember({j: v for j, v in written.items() if j not in out.failed}, _BINDING)


def _requeue_failed_binds(plan: Plan, out: Outcome, now: datetime, attempts_max: int) -> set[int]:
    """admitted -> queued, with a new attempt and backoff, for the claims that did not
    bind; admitted -> failed, with the last error, for those that reached `attempts_max`
    (a pod the API server refuses is refused again: retrying for ever
    would place the job, and preempt others for it, at every try). Returns the jobs
    written."""
    failed = [j for j in out.failed if j in plan.claimed]
    if not failed:
        return set()
    attempts = dict(Job.objects.filter(id__any=failed).values_list("id", "attempt"))
    before = dict(
        JobEvent.objects.filter(job_id__any=failed, kind=BIND_FAILED)
        .values_list("job_id")
        .annotate(n=Count("id"))
    )
    changes = []
    for job_id in failed:
        why, tries = out.failed[job_id], before.get(job_id, 0) + 1
        if tries >= attempts_max:
            changes.append(
                Change(
                    job_id,
                    (S.ADMITTED,),
                    S.FAILED,
                    kind=BIND_FAILED,
                    message=f"Failed: its pods could not be bound ({counted(tries, 'try')}): {why}",
                    reason=f"bind failed {counted(tries, 'time')}: {why}",
                )
            )
            continue
        delay = min(300, 5 * 2 ** min(attempts.get(job_id, 0), 6))
        changes.append(
            Change(
                job_id,
                (S.ADMITTED,),
                S.QUEUED,
                new_attempt=True,
                not_before=now + timedelta(seconds=delay),
                kind=BIND_FAILED,
                message=f"Bind failed (try {tries} of {attempts_max}), back to the queue: {why}",
                reason=f"bind failed ({why}); retrying in {delay} s",
            )
        )
    return set(transition(changes, now).done)
