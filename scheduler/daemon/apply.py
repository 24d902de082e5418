"""Phase A of a cycle: apply the engine's decisions. Preempt, claim (queued -> admitted) and
allocate, in one fenced transaction; the waiting reasons are written later (`write_reasons`).
Phases B and C (bind, commit) are `scheduler.daemon.bind`.

Phase A and C are fenced transactions; phase B talks to the cluster outside any transaction.
The order makes every crash recoverable by reconcile: an allocation is committed before its
pod is created (so a pod without an allocation is always an orphan), and a bind is recorded
only after it happened (so a bound pod of an `admitted` job is adopted, not lost).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from django.db import IntegrityError, transaction

from scheduler.backends.base import PodRequest
from scheduler.backends.workloads import workload_ref
from scheduler.core.types import CycleResult, DeviceShare, Placement, WaitCode
from scheduler.daemon.history import preemptor_rows, reason_shape, wait_data, write_wait_events
from scheduler.daemon.store import insert_allocations, set_reasons
from scheduler.jobs.lifecycle import HOLDING_STATES
from scheduler.jobs.transitions import Change, insert_events, transition
from scheduler.leader import Lease
from scheduler.models import Allocation, Job, JobState
from scheduler.snapshot.build import Built
from scheduler.snapshot.cache import SnapshotCache
from scheduler.snapshot.translate import Decisions, decisions, job_pk, pod_request

log = logging.getLogger("gantry.daemon")
S = JobState
_ADMITTED = {"state": S.ADMITTED, "reason": ""}
REASONS_PER_CYCLE = 500


@dataclass
class Plan:
    """What phase A committed and phase B must realise."""

    pods: dict[int, list[PodRequest]] = field(default_factory=dict)  # job id -> new pods
    allocations: dict[int, list[int]] = field(default_factory=dict)  # job id -> allocation ids
    claimed: set[int] = field(default_factory=set)  # queued -> admitted (others grow)
    deletions: list[tuple[str, str, int]] = field(default_factory=list)  # ns, pod, grace
    # Users' Jobs (issue 37) whose jobs were preempted: suspended, their pods left to their
    # controller (a pod Gantry deleted would count against the Job's backoffLimit).
    suspensions: list[tuple[str, str]] = field(default_factory=list)  # ns, "<plural>/<name>"
    preempted: int = 0
    shares: dict[int, tuple[DeviceShare, ...]] = field(default_factory=dict)  # by allocation
    reasons: dict[int, str] = field(default_factory=dict)  # job id -> changed reason to write
    # job id -> (reason, event data) of the reasons whose shape changed: history events
    history: dict[int, tuple[str, dict[str, Any]]] = field(default_factory=dict)

    def taken_milli(self) -> int:
        """Milli-GPU the allocations written in this cycle hold."""
        return sum(s.milli for shares in self.shares.values() for s in shares)


# --- phase A ------------------------------------------------------------------------------------


def _deferred_reason(job_id: int, placement: Placement, chosen: Decisions) -> str:
    """Why a placed job waits for other jobs to stop: it preempted them, or it fits only on
    the quota or devices that jobs preempted for others free."""
    victims = placement.victims
    own = [v for v in victims if job_id in chosen.preemptor_of.get(job_pk(v), ())]
    if not victims:
        return "preempting job(s) of lower priority; starts when they have stopped"
    if own:
        return f"preempting job(s) {', '.join(own)}; starts when they have stopped"
    return f"waiting for job(s) {', '.join(victims)} to stop, preempted for other jobs"


def apply_decisions(
    built: Built,
    result: CycleResult,
    *,
    lease: Lease,
    cache: SnapshotCache,
    now: datetime,
    reasons_due: bool,
) -> Plan:
    """`reasons_due`: whether the waiting reasons of every job are refreshed this cycle
    (otherwise only those of jobs waiting on their victims)."""
    plan = Plan()
    chosen = decisions(result)
    # A job in retry backoff keeps the reason its attempt failed with.
    waiting = {
        job_id: w.message
        for job_id, w in chosen.waiting
        if not (w.code == WaitCode.BACKOFF and built.jobs[job_id]["reason"])
    }
    held = _victim_devices(built, chosen)
    pending = set(built.pending_ids)
    deferred: set[int] = set()
    for job_id, placement in chosen.placements:
        uses = {(a.node, sh.device) for a in placement.assignments for sh in a.shares}
        if placement.victims or uses & held:
            deferred.add(job_id)
            if job_id in pending:
                waiting[job_id] = _deferred_reason(job_id, placement, chosen)
    # Jobs waiting on their victims are told at once; the other reasons are refreshed at the
    # daemon's pace, the head of the queue first, the rest on later refreshes (bounds the
    # writes when thousands wait and their reasons' figures keep changing).
    placed = {job_id for job_id, _ in chosen.placements if job_id not in deferred}
    order = [j for j in built.pending_ids if j in waiting and j not in placed]
    if not reasons_due:
        order = [j for j in order if j in deferred]
    current = {j: built.jobs[j]["reason"] for j in order}
    changed = [j for j in order if current[j] != waiting[j][:500]][:REASONS_PER_CYCLE]
    # Reasons are written after the pods are bound (`write_reasons`), in their own
    # transaction: hundreds of them must not delay the placed jobs' start.
    plan.reasons = {j: waiting[j][:500] for j in changed}
    told = dict(chosen.waiting)
    plan.history = {
        j: (text, wait_data(told[j], now, built.snapshot.now) if j in told else {})
        for j, text in plan.reasons.items()
        if reason_shape(text) != reason_shape(current[j])
    }
    if not (chosen.preemptions or placed):
        return plan  # nothing to write here: no transaction
    written: dict[int, int] = {}
    with lease.writing():
        _preempt(built, chosen, plan, now)
        _place(lease.epoch or 0, built, chosen, plan, now, deferred, written)
    # Committed. A claim undone in the same transaction is no longer in `plan.claimed`. The
    # new allocations' device shares go to the cache too (they never change while active).
    cache.remember({j: v for j, v in written.items() if j in plan.claimed}, _ADMITTED)
    cache.shares.update(plan.shares)
    return plan


def write_reasons(plan: Plan, lease: Lease, cache: SnapshotCache) -> None:
    """The waiting reasons the cycle decided (jobs still queued only), fenced; the new row
    versions go to the snapshot cache."""
    if not plan.reasons:
        return
    written: dict[int, int] = {}
    with lease.writing():
        set_reasons(plan.reasons, written)
        write_wait_events(plan.history)
    for job_id, version in written.items():
        cache.remember({job_id: version}, {"reason": plan.reasons[job_id]})


def _preempt(built: Built, chosen: Decisions, plan: Plan, now: datetime) -> None:
    """Write the cycle's preemptions. The engine does not know which jobs are stopping: a
    victim already preempted, whose pods are still going, is chosen again until they are
    gone, and has nothing to write. A victim that another writer changed or holds locked
    is not preempted; its preemptor's placement waits for it anyway (`deferred`), and the
    next cycle decides again."""
    whole = [
        (job_id, p)
        for job_id, p in chosen.preemptions
        if p.whole_job and built.jobs[job_id]["state"] in HOLDING_STATES
    ]
    changes = [
        Change(
            job_id,
            HOLDING_STATES,
            S.PREEMPTED,
            message=f"Preempted: {p.reason}.",
            reason=f"preempted: {p.reason}",
            kind="preempted",
            data={"preemptor": p.preemptor, "work_lost_gpu_s": round(p.work_lost_gpu_s)},
        )
        for job_id, p in whole
    ]
    done = transition(changes, now).done
    plan.preempted = len(done)
    stopping = (
        list(Allocation.objects.filter(job_id__any=list(done), ended_at__isnull=True))
        if done
        else []
    )
    caused = [(job_id, p) for job_id, p in whole if job_id in done]
    for job_id, p in chosen.preemptions:
        if not p.whole_job:
            shrinking = list(
                Allocation.objects.filter(
                    job_id=job_id, replica__in=p.replicas, ended_at__isnull=True
                )
            )
            if any(a.end_reason != "preempted" for a in shrinking):  # not chosen before
                caused.append((job_id, p))
            stopping += shrinking
    # The preemptors' histories: what each caused (a victim chosen again is not told again).
    insert_events(preemptor_rows(caused, {job_pk(r.job.id): r for r in built.snapshot.running}))
    held = _workloads({a.job_id for a in stopping})
    for allocation in stopping:
        allocation.end_reason = "preempted"
        if allocation.job_id not in held:
            plan.deletions.append((allocation.namespace, allocation.pod_name, 30))
    plan.suspensions += sorted(
        {(a.namespace, held[a.job_id]) for a in stopping if a.job_id in held}
    )
    if stopping:
        Allocation.objects.bulk_update(stopping, ["end_reason"])


def _workloads(job_ids: set[int]) -> dict[int, str]:
    """Of `job_ids`, the jobs of objects users created that Gantry resumes (issue 37): job
    id -> "<plural>/<name>" ("jobs/ddp", "jobsets/train")."""
    if not job_ids:
        return {}
    rows = Job.objects.filter(id__any=list(job_ids)).values_list("id", "spec__workload")
    return {i: ref for i, w in rows if (ref := workload_ref(w))}


def _victim_devices(built: Built, chosen: Decisions) -> set[tuple[str, int]]:
    """Devices of this cycle's victims. The engine counts them free at once; they are free
    only when the victims' pods are gone, so no placement may use them this cycle (neither
    the preemptor's nor another job's that the engine fitted into what was left)."""
    running = {job_pk(r.job.id): r for r in built.snapshot.running}
    out: set[tuple[str, int]] = set()
    for job_id, p in chosen.preemptions:
        victim = running.get(job_id)
        if victim is None:
            continue
        for a in victim.assignments:
            if p.whole_job or a.replica in p.replicas:
                out.update((a.node, sh.device) for sh in a.shares)
    return out


def _place(
    epoch: int,
    built: Built,
    chosen: Decisions,
    plan: Plan,
    now: datetime,
    deferred: set[int],
    versions: dict[int, int],
) -> None:
    pending = set(built.pending_ids)
    ready = [(j, p) for j, p in chosen.placements if j not in deferred]
    fresh = [(j, p) for j, p in ready if j in pending]
    grow = [(j, p) for j, p in ready if j not in pending]
    admitted = "Admitted: placement decided, quota charged."
    claims = [Change(j, (S.QUEUED,), S.ADMITTED, message=admitted) for j, _ in fresh]
    claimed = set(transition(claims, now, versions=versions).done)
    plan.claimed = claimed
    growing = (
        set(
            Job.objects.filter(
                id__any=[j for j, _ in grow], state__in=(S.BINDING, S.RUNNING)
            ).values_list("id", flat=True)
        )
        if grow
        else set()
    )
    placing = [(j, p) for j, p in fresh if j in claimed]
    placing += [(j, p) for j, p in grow if j in growing]
    if not placing:
        return
    try:
        with transaction.atomic():
            _allocate(epoch, built, placing, plan, now)
    except IntegrityError as error:
        # The snapshot was stale somewhere (a device given out meanwhile): one job at a time,
        # so only the conflicting ones wait for the next cycle.
        log.warning("bulk allocation conflicted (%s); allocating job by job", error)
        plan.pods.clear()
        plan.allocations.clear()
        plan.shares.clear()
        for job_id, placement in placing:
            try:
                with transaction.atomic():
                    _allocate(epoch, built, [(job_id, placement)], plan, now)
            except IntegrityError as error:
                log.warning("job %s not allocated: %s", job_id, error)
                _unclaim(job_id, now)
                plan.claimed.discard(job_id)


def _unclaim(job_id: int, now: datetime) -> None:
    """admitted -> queued for a claim that got no allocation. If the row is locked (a
    cancel in flight), it stays admitted without an allocation: reconcile's sweep
    (`scheduler.daemon.judge.release_lost_claims`) returns it to the queue."""
    transition(
        [
            Change(
                job_id,
                (S.ADMITTED,),
                S.QUEUED,
                reason="placement conflicted with another allocation; retrying next cycle",
            )
        ],
        now,
    )


def _allocate(
    epoch: int, built: Built, placements: list[tuple[int, Placement]], plan: Plan, now: datetime
) -> None:
    rows: list[tuple[Any, ...]] = []
    shares: list[list[tuple[int, int, int]]] = []
    held: list[tuple[DeviceShare, ...]] = []  # the same shares, as the snapshot reads them
    requests: list[PodRequest] = []
    for job_id, placement in placements:
        row = built.jobs[job_id]
        for a in placement.assignments:
            request = pod_request(row, a.replica, a.node, tuple(s.device for s in a.shares))
            rows.append(
                (
                    row["id"],
                    built.nodes[a.node],
                    row["attempt"],
                    a.replica,
                    request.name,
                    request.namespace,
                    placement.flavor,
                    a.gpu_milli,
                    a.elastic,
                    epoch,
                    now,
                    "",
                )
            )
            shares.append(
                [(built.devices[(a.node, s.device)], s.milli, s.memory_mib) for s in a.shares]
            )
            requests.append(request)
            held.append(tuple(sorted(a.shares, key=lambda share: share.device)))
    ids = insert_allocations(rows, shares)
    for allocation_id, request, devices in zip(ids, requests, held, strict=True):
        plan.pods.setdefault(request.job_id, []).append(request)
        plan.allocations.setdefault(request.job_id, []).append(allocation_id)
        plan.shares[allocation_id] = devices


# --- phase B ------------------------------------------------------------------------------------


# --- phase C ------------------------------------------------------------------------------------
