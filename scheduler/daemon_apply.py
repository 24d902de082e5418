"""Apply one cycle's decisions: claim and allocate (phase A), bind through the backend
(phase B), commit what bound and return what did not (phase C).

Phase A and C are fenced transactions; phase B talks to the cluster outside any transaction.
The order makes every crash recoverable by reconcile: an allocation is committed before its
pod is created (so a pod without an allocation is always an orphan), and a bind is recorded
only after it happened (so a bound pod of an `admitted` job is adopted, not lost).
"""

from __future__ import annotations

import logging
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from django.db import IntegrityError, connection, transaction
from django.db.models import Count

from scheduler.adapters import Built, release, set_reasons
from scheduler.backends.base import BackendError, BindConflict, PodRequest, pod_name
from scheduler.core.types import CycleResult, DeviceShare, Placement, WaitCode
from scheduler.lifecycle import HOLDING_STATES
from scheduler.models import Allocation, AllocationDevice, Job, JobEvent, JobState
from scheduler.transitions import Change, set_state_fast, transition_many

if TYPE_CHECKING:
    from scheduler.daemon import Daemon

log = logging.getLogger("gantry.daemon")
S = JobState
_ADMITTED = {"state": S.ADMITTED, "reason": ""}
_BINDING = {"state": S.BINDING, "reason": ""}
REASONS_PER_CYCLE = 500
BIND_FAILED = "bind_failed"  # the kind of a failed bind's event, counted for its limit


@dataclass
class Plan:
    """What phase A committed and phase B must realise."""

    pods: dict[int, list[PodRequest]] = field(default_factory=dict)  # job id -> new pods
    allocations: dict[int, list[int]] = field(default_factory=dict)  # job id -> allocation ids
    claimed: set[int] = field(default_factory=set)  # queued -> admitted (others grow)
    deletions: list[tuple[str, str, int]] = field(default_factory=list)  # ns, pod, grace
    preempted: int = 0
    shares: dict[int, tuple[DeviceShare, ...]] = field(default_factory=dict)  # by allocation
    reasons: dict[int, str] = field(default_factory=dict)  # job id -> changed reason to write


@dataclass
class Outcome:
    bound: dict[int, list[int]] = field(default_factory=dict)
    failed: dict[int, str] = field(default_factory=dict)  # job id -> why
    # Pods whose name something else already holds: not ours, so never deleted by us.
    foreign: set[tuple[str, str]] = field(default_factory=set)


# --- phase A ------------------------------------------------------------------------------------


def _deferred_reason(placement: Any, preemptors: set[tuple[str, str]]) -> str:
    """Why a placed job waits for other jobs to stop: it preempted them, or it fits only on
    the quota or devices that jobs preempted for others free."""
    victims = placement.preempted
    own = [v for v in victims if (placement.job_id, v) in preemptors]
    if not victims:
        return "preempting job(s) of lower priority; starts when they have stopped"
    if own:
        return f"preempting job(s) {', '.join(own)}; starts when they have stopped"
    return f"waiting for job(s) {', '.join(victims)} to stop, preempted for other jobs"


def apply_decisions(daemon: Daemon, built: Built, result: CycleResult) -> Plan:
    plan = Plan()
    now = daemon.now_dt()
    # A job in retry backoff keeps the reason its attempt failed with.
    waiting = {
        int(w.job_id): w.message
        for w in result.waiting
        if not (w.code == WaitCode.BACKOFF and built.jobs[w.job_id]["reason"])
    }
    held = _victim_devices(built, result)
    pending = set(built.pending_ids)
    deferred: set[str] = set()
    preemptors = {(p.preemptor, p.job_id) for p in result.preemptions}
    for placement in result.placements:
        job_id = int(placement.job_id)
        uses = {(a.node, sh.device) for a in placement.assignments for sh in a.shares}
        if placement.preempted or uses & held:
            deferred.add(placement.job_id)
            if job_id in pending:
                waiting[job_id] = _deferred_reason(placement, preemptors)
    # Jobs waiting on their victims are told at once; the other reasons are refreshed at the
    # daemon's pace, the head of the queue first, the rest on later refreshes (bounds the
    # writes when thousands wait and their reasons' figures keep changing).
    placed = {int(p.job_id) for p in result.placements if p.job_id not in deferred}
    order = [j for j in built.pending_ids if j in waiting and j not in placed]
    if not daemon.reasons_due():
        order = [j for j in order if str(j) in deferred]
    current = {j: built.jobs[str(j)]["reason"] for j in order}
    changed = [j for j in order if current[j] != waiting[j][:500]][:REASONS_PER_CYCLE]
    # Reasons are written after the pods are bound (`write_reasons`), in their own
    # transaction: hundreds of them must not delay the placed jobs' start.
    plan.reasons = {j: waiting[j][:500] for j in changed}
    if not (result.preemptions or placed):
        return plan  # nothing to write here: no transaction
    written: dict[int, int] = {}
    with transaction.atomic():
        daemon.lease.fence()
        _preempt(built, result, plan, now)
        _place(daemon, built, result, plan, now, deferred, written)
    # Committed. A claim undone in the same transaction is no longer in `plan.claimed`. The
    # new allocations' device shares go to the cache too (they never change while active).
    daemon.cache.remember({j: v for j, v in written.items() if j in plan.claimed}, _ADMITTED)
    daemon.cache.shares.update(plan.shares)
    return plan


def write_reasons(daemon: Daemon, plan: Plan) -> None:
    """The waiting reasons the cycle decided (jobs still queued only), fenced; the new row
    versions go to the snapshot cache."""
    if not plan.reasons:
        return
    written: dict[int, int] = {}
    with transaction.atomic():
        daemon.lease.fence()
        set_reasons(plan.reasons, written)
    for job_id, version in written.items():
        daemon.cache.remember({job_id: version}, {"reason": plan.reasons[job_id]})


def _preempt(built: Built, result: CycleResult, plan: Plan, now: datetime) -> None:
    """Write the cycle's preemptions. The engine does not know which jobs are stopping: a
    victim already preempted, whose pods are still going, is chosen again until they are
    gone, and has nothing to write. A victim that another writer changed or holds locked
    is not preempted; its preemptor's placement waits for it anyway (`deferred`), and the
    next cycle decides again."""
    whole = [
        p
        for p in result.preemptions
        if p.whole_job and built.jobs[p.job_id]["state"] in HOLDING_STATES
    ]
    changes = [
        Change(
            int(p.job_id),
            HOLDING_STATES,
            S.PREEMPTED,
            message=f"Preempted: {p.reason}.",
            reason=f"preempted: {p.reason}",
            kind="preempted",
            data={"preemptor": p.preemptor, "work_lost_gpu_s": round(p.work_lost_gpu_s)},
        )
        for p in whole
    ]
    done = transition_many(changes, now).done
    plan.preempted = len(done)
    stopping = list(Allocation.objects.filter(job_id__any=list(done), ended_at__isnull=True))
    for p in result.preemptions:
        if not p.whole_job:
            stopping += list(
                Allocation.objects.filter(
                    job_id=int(p.job_id), replica__in=p.replicas, ended_at__isnull=True
                )
            )
    for allocation in stopping:
        allocation.end_reason = "preempted"
        plan.deletions.append((allocation.namespace, allocation.pod_name, 30))
    Allocation.objects.bulk_update(stopping, ["end_reason"])


def _victim_devices(built: Built, result: CycleResult) -> set[tuple[str, int]]:
    """Devices of this cycle's victims. The engine counts them free at once; they are free
    only when the victims' pods are gone, so no placement may use them this cycle (neither
    the preemptor's nor another job's that the engine fitted into what was left)."""
    running = {r.job.id: r for r in built.snapshot.running}
    out: set[tuple[str, int]] = set()
    for p in result.preemptions:
        victim = running.get(p.job_id)
        if victim is None:
            continue
        for a in victim.assignments:
            if p.whole_job or a.replica in p.replicas:
                out.update((a.node, sh.device) for sh in a.shares)
    return out


def _place(
    daemon: Daemon,
    built: Built,
    result: CycleResult,
    plan: Plan,
    now: datetime,
    deferred: set[str],
    versions: dict[int, int],
) -> None:
    pending = set(built.pending_ids)
    ready = [p for p in result.placements if p.job_id not in deferred]
    fresh = [p for p in ready if int(p.job_id) in pending]
    grow = [p for p in ready if int(p.job_id) not in pending]
    claimed = set(
        set_state_fast(
            [int(p.job_id) for p in fresh],
            S.QUEUED,
            S.ADMITTED,
            now,
            "Admitted: placement decided, quota charged.",
            versions=versions,
        )
    )
    plan.claimed = claimed
    growing = set(
        Job.objects.filter(
            id__any=[int(p.job_id) for p in grow], state__in=(S.BINDING, S.RUNNING)
        ).values_list("id", flat=True)
    )
    chosen = [p for p in fresh if int(p.job_id) in claimed]
    chosen += [p for p in grow if int(p.job_id) in growing]
    if not chosen:
        return
    try:
        with transaction.atomic():
            _allocate(daemon, built, chosen, plan, now)
    except IntegrityError as error:
        # The snapshot was stale somewhere (a device given out meanwhile): one job at a time,
        # so only the conflicting ones wait for the next cycle.
        log.warning("bulk allocation conflicted (%s); allocating job by job", error)
        plan.pods.clear()
        plan.allocations.clear()
        plan.shares.clear()
        for placement in chosen:
            try:
                with transaction.atomic():
                    _allocate(daemon, built, [placement], plan, now)
            except IntegrityError as error:
                log.warning("job %s not allocated: %s", placement.job_id, error)
                _unclaim(int(placement.job_id), now)
                plan.claimed.discard(int(placement.job_id))


def _unclaim(job_id: int, now: datetime) -> None:
    """admitted -> queued for a claim that got no allocation. If the row is locked (a
    cancel in flight), it stays admitted without an allocation: reconcile's sweep
    (`daemon_reconcile.release_lost_claims`) returns it to the queue."""
    transition_many(
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


ALLOCATION_COLUMNS = (
    "job_id",
    "node_id",
    "attempt",
    "replica",
    "pod_name",
    "namespace",
    "flavor",
    "gpu_milli",
    "elastic",
    "epoch",
    "started_at",
    "end_reason",
)


def _allocate(
    daemon: Daemon, built: Built, placements: list[Placement], plan: Plan, now: datetime
) -> None:
    rows: list[tuple[Any, ...]] = []
    shares: list[list[tuple[int, int, int]]] = []
    held: list[tuple[DeviceShare, ...]] = []  # the same shares, as the snapshot reads them
    requests: list[PodRequest] = []
    specs = dict(
        Job.objects.filter(id__any=[int(p.job_id) for p in placements]).values_list("id", "spec")
    )
    epoch = daemon.lease.epoch or 0
    for placement in placements:
        row = {**built.jobs[placement.job_id], "spec": specs.get(int(placement.job_id))}
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


def insert_allocations(
    rows: list[tuple[Any, ...]], shares: list[list[tuple[int, int, int]]]
) -> list[int]:
    """Allocation rows (ALLOCATION_COLUMNS) and their device shares; returns the ids. On
    PostgreSQL through COPY with ids drawn from the sequence first (the triggers fire for
    COPY as for INSERT); elsewhere bulk_create."""
    if connection.vendor != "postgresql":
        made = Allocation.objects.bulk_create(
            [Allocation(**dict(zip(ALLOCATION_COLUMNS, r, strict=True))) for r in rows]
        )
        ids = [a.pk for a in made]
        AllocationDevice.objects.bulk_create(
            [
                AllocationDevice(allocation_id=i, device_id=d, milli=m, memory_mib=mem)
                for i, per in zip(ids, shares, strict=True)
                for (d, m, mem) in per
            ]
        )
        return ids
    with connection.cursor() as cursor, connection.wrap_database_errors:
        cursor.execute(
            "SELECT nextval(pg_get_serial_sequence('scheduler_allocation', 'id'))"
            " FROM generate_series(1, %s)",
            [len(rows)],
        )
        ids = [r[0] for r in cursor.fetchall()]
        raw = cursor.cursor
        columns = ", ".join(("id", *ALLOCATION_COLUMNS))
        with raw.copy(f"COPY scheduler_allocation ({columns}) FROM STDIN") as copy:
            for allocation_id, row in zip(ids, rows, strict=True):
                copy.write_row((allocation_id, *row))
        share_columns = "allocation_id, device_id, milli, memory_mib, released"
        with raw.copy(f"COPY scheduler_allocationdevice ({share_columns}) FROM STDIN") as copy:
            for allocation_id, per in zip(ids, shares, strict=True):
                for device, milli, memory in per:
                    copy.write_row((allocation_id, device, milli, memory, False))
    return ids


def pod_request(
    row: dict[str, Any], replica: int, node: str, devices: tuple[int, ...]
) -> PodRequest:
    spec = row["spec"] or {}
    sim = spec.get("simulation") or {}
    return PodRequest(
        name=pod_name(row["id"], row["attempt"], replica),
        namespace=row["project__namespace"],
        job_id=row["id"],
        attempt=row["attempt"],
        replica=replica,
        replicas=row["replicas"],
        node=node,
        gpu_indices=devices,
        gpu_milli=row["gpu_milli_per_replica"],
        gpu_memory_mib=row["gpu_memory_mib"],
        cpu_milli=row["cpu_milli"],
        memory_mib=row["memory_mib"],
        image=spec.get("image", ""),
        command=tuple(spec.get("command") or ()),
        env=dict(spec.get("env") or {}),
        priority_class=spec.get("priority_class") or "",
        job_type=row["job_type"],
        sim_duration_s=sim.get("duration_s"),
        sim_fail=bool(sim.get("fail")),
    )


# --- phase B ------------------------------------------------------------------------------------


def call_with_retry(daemon: Daemon, call: Callable[[], None], what: str) -> None:
    """Retry transient backend errors with bounded, jittered backoff; re-raise the last.
    Every try of this write to the cluster is fenced first (`Daemon.fence_cluster_write`):
    LeaseLost, and nothing sent, once this daemon no longer leads."""
    for attempt in range(daemon.backend_retries):
        daemon.fence_cluster_write()
        try:
            call()
            return
        except BackendError as error:
            if attempt + 1 == daemon.backend_retries:
                raise
            delay = error.retry_after_s or daemon.backend_backoff_s * (2**attempt)
            delay = min(delay, 5.0) * (0.5 + daemon.random())
            log.info("backend %s failed (%s); retrying in %.2fs", what, error, delay)
            daemon.sleep(delay)


def delete_pods(daemon: Daemon, deletions: list[tuple[str, str, int]]) -> None:
    for namespace, name, grace in deletions:

        def delete(namespace: str = namespace, name: str = name, grace: int = grace) -> None:
            daemon.backend.delete_pod(namespace, name, grace)

        try:
            call_with_retry(daemon, delete, "delete")
        except BackendError as error:  # reconcile deletes it on a later cycle
            log.warning("could not delete pod %s/%s: %s", namespace, name, error)


def _creator(daemon: Daemon, pod: PodRequest) -> Callable[[], None]:
    return lambda: daemon.backend.create_pod(pod)


def _binder(daemon: Daemon, pod: PodRequest) -> Callable[[], None]:
    return binder(daemon, pod.namespace, pod.name, pod.node)


def binder(daemon: Daemon, namespace: str, name: str, node: str) -> Callable[[], None]:
    return lambda: daemon.backend.bind_pod(namespace, name, node)


def bind_plan(daemon: Daemon, plan: Plan) -> Outcome:
    out = Outcome()
    delete_pods(daemon, plan.deletions)
    created: dict[int, list[PodRequest]] = defaultdict(list)
    for job_id, pods in plan.pods.items():
        try:
            for pod in pods:
                call_with_retry(daemon, _creator(daemon, pod), "create")
                created[job_id].append(pod)
        except BackendError as error:
            out.failed[job_id] = f"creating pods failed: {error}"
        except BindConflict as conflict:
            # Another object holds the deterministic name. The requeue raises the attempt,
            # so the next try uses a fresh name; the foreign pod is left alone.
            out.failed[job_id] = f"creating pods failed: {conflict}"
            out.foreign.add((pod.namespace, pod.name))
    daemon.hook("pods_created")
    for job_id, pods in created.items():
        if job_id in out.failed:
            continue
        try:
            for pod in pods:
                call_with_retry(daemon, _binder(daemon, pod), "bind")
            out.bound[job_id] = plan.allocations[job_id]
        except BindConflict as conflict:
            where = f" (bound to {conflict.bound_node})" if conflict.bound_node else ""
            out.failed[job_id] = f"bind conflict{where}: {conflict}"
        except BackendError as error:
            out.failed[job_id] = f"binding failed: {error}"
    daemon.hook("bound")
    return out


# --- phase C ------------------------------------------------------------------------------------


def commit_binds(daemon: Daemon, plan: Plan, out: Outcome) -> None:
    """Record what bound (admitted -> binding) and return what did not to the queue.
    A claim's allocations are released only with its state change: a job whose row another
    session holds locked stays admitted and keeps them (its pods were deleted, so the next
    reconcile releases the claim), never admitted without an allocation."""
    now = daemon.now_dt()
    failed_pods = [
        (p.namespace, p.name, 0)
        for j in out.failed
        for p in plan.pods.get(j, [])
        if (p.namespace, p.name) not in out.foreign
    ]
    delete_pods(daemon, failed_pods)
    if not (out.bound or out.failed):
        return  # nothing was bound or failed: nothing to record
    bound_jobs = [j for j in out.bound if j in plan.claimed]
    written: dict[int, int] = {}
    with transaction.atomic():
        daemon.lease.fence()
        bound_ids = [a for ids in out.bound.values() for a in ids]
        Allocation.objects.filter(id__any=bound_ids).update(bound_at=now)
        # A job skipped here (row locked) stays admitted with its pods bound: adopted by
        # the next reconcile.
        set_state_fast(
            bound_jobs,
            S.ADMITTED,
            S.BINDING,
            now,
            "Bound: pods created and bound to their nodes.",
            versions=written,
        )
        moved = _requeue_failed_binds(daemon, plan, out, now)
        # An elastic replica that did not bind is simply not grown this time.
        freed = [j for j in out.failed if j not in plan.claimed or j in moved]
        release([a for j in freed for a in plan.allocations.get(j, [])], now, "bind failed")
        daemon.hook("before_commit")
    # Committed; a job bound in part and failed in part was written twice: not remembered.
    daemon.cache.remember({j: v for j, v in written.items() if j not in out.failed}, _BINDING)


def _requeue_failed_binds(daemon: Daemon, plan: Plan, out: Outcome, now: datetime) -> set[int]:
    """admitted -> queued, with a new attempt and backoff, for the claims that did not
    bind; admitted -> failed, with the last error, for those that reached the daemon's
    `bind_attempts` (a pod the API server refuses is refused again: retrying for ever
    would place the job, and preempt others for it, at every try). Returns the jobs
    written."""
    failed = [j for j in out.failed if j in plan.claimed]
    attempts = dict(Job.objects.filter(id__any=failed).values_list("id", "attempt"))
    before = dict(
        JobEvent.objects.filter(job_id__any=failed, kind=BIND_FAILED)
        .values_list("job_id")
        .annotate(n=Count("id"))
    )
    changes = []
    for job_id in failed:
        why, tries = out.failed[job_id], before.get(job_id, 0) + 1
        if tries >= daemon.bind_attempts:
            changes.append(
                Change(
                    job_id,
                    (S.ADMITTED,),
                    S.FAILED,
                    kind=BIND_FAILED,
                    message=f"Failed: its pods could not be bound ({tries} tries): {why}",
                    reason=f"bind failed {tries} times: {why}",
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
                message=f"Bind failed ({tries} of {daemon.bind_attempts} tries), back to the "
                f"queue: {why}",
                reason=f"bind failed ({why}); retrying in {delay} s",
            )
        )
    return set(transition_many(changes, now).done)
