"""Phases B and C of a cycle: create and bind the claimed pods in the cluster (concurrently
where the backend's writes are network calls), then record what bound (admitted -> binding)
and return what did not to the queue."""

from __future__ import annotations

import logging
import queue
from collections import defaultdict
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from django.db.models import Count

from common.words import counted
from scheduler.backends.base import BackendError, BindConflict, PodRequest
from scheduler.daemon.apply import Plan
from scheduler.daemon.calls import Call
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


class _NotSent(Exception):
    """A call its thread did not send: another call of its gang had failed by then. Told
    apart from a call that succeeded, so a held pod never admitted is not taken as admitted
    (and deleted at the commit: the user's pod made again under its name)."""


@dataclass
class Outcome:
    bound: dict[int, list[int]] = field(default_factory=dict)
    failed: dict[int, str] = field(default_factory=dict)  # job id -> why
    # Pods whose name something else already holds: not ours, so never deleted by us.
    foreign: set[tuple[str, str]] = field(default_factory=set)
    # Held pods (a user's, gated: `PodRequest.held`) this phase admitted: Gantry's from then on.
    admitted: set[tuple[str, str]] = field(default_factory=set)


def bind_plan(cluster: Cluster, plan: Plan, hook: Hook, deadline_s: float = 15.0) -> Outcome:
    """Phase B: the claimed jobs' pods created and bound, the preempted ones' deleted.

    A backend whose writes are network calls (`cluster.calls.threaded`) gets them concurrently,
    each job's as soon as the cycle claimed it (`_Binding`); any other is called in order in
    this thread (`_bind_in_order`). Either way a gang binds all or nothing: its pods are
    bound only once all were created, and a job with any pod that failed is failed whole (its
    pods deleted at the commit)."""
    cluster.suspend_workloads(plan.suspensions)  # before anything else frees their GPUs
    if cluster.calls.threaded:
        return _Binding(cluster, plan, hook, deadline_s).run()
    return _bind_in_order(cluster, plan, hook)


def _bind_in_order(cluster: Cluster, plan: Plan, hook: Hook) -> Outcome:
    """Every pod created, then every pod bound, one call after the other. Test hooks:
    "pods_created" once all were created, "bound" once all were bound."""
    out = Outcome()
    cluster.delete_pods(plan.deletions)
    created: dict[int, list[PodRequest]] = defaultdict(list)
    for job_id, pods in plan.pods.items():
        try:
            for pod in pods:
                cluster.create(pod)
                created[job_id].append(pod)
                if pod.held:
                    out.admitted.add((pod.namespace, pod.name))
        except BackendError as error:
            out.failed[job_id] = f"creating pods failed: {error}"
        except BindConflict as conflict:
            out.failed[job_id] = f"creating pods failed: {conflict}"
            if _foreign(conflict):
                out.foreign.add((pod.namespace, pod.name))
    hook("pods_created")
    for job_id, pods in created.items():
        if job_id in out.failed:
            continue
        try:
            if not cluster.creates_bound:
                for pod in pods:
                    if not pod.workload:  # a workload's pods are bound once they exist
                        cluster.bind(pod.namespace, pod.name, pod.node)
            out.bound[job_id] = plan.allocations[job_id]
        except BindConflict as conflict:
            out.failed[job_id] = _conflict(conflict)
        except BackendError as error:
            out.failed[job_id] = f"binding failed: {error}"
    hook("bound")
    return out


def _foreign(conflict: BindConflict) -> bool:
    """Another object holds the deterministic name: not ours, so never deleted by us (the
    requeue raises the attempt, so the next try uses a fresh name). A pod of ours found on
    another node (`bound_node`) is ours, and is deleted."""
    return conflict.bound_node is None and not conflict.deleting


def _conflict(conflict: BindConflict) -> str:
    where = f" (bound to {conflict.bound_node})" if conflict.bound_node else ""
    return f"bind conflict{where}: {conflict}"


class _Binding:
    """Phase B over the call pool's threads. Every job's creates go out at once; a job whose
    pods were all created has its binds sent at once (none when the backend creates pods
    bound); no job waits for another's calls. This thread waits for the answers, renews the
    lease meanwhile (`keep_for_threads`), and gives up on a call that has run `deadline_s`
    without an answer: its job fails (requeued as any failed bind), and the call's thread ends
    on its own request timeout; a pod it still creates is an orphan that reconcile deletes.
    Test hooks: "pods_created" when a job's pods were all created, "bound" at the end."""

    def __init__(self, cluster: Cluster, plan: Plan, hook: Hook, deadline_s: float) -> None:
        self.cluster, self.plan, self.hook, self.deadline_s = cluster, plan, hook, deadline_s
        self.out = Outcome()
        self.left: dict[int, int] = {}  # job id -> calls of its current step not answered
        self.created: dict[int, list[PodRequest]] = defaultdict(list)
        # The calls not answered, in the order sent, which is the order the pool's threads
        # start them (its queue is first in, first out): the started ones lead.
        self.waiting: dict[Future[None], Call] = {}
        # Each call's future as it is answered (or times out on its thread, after its
        # deadline here): one wakeup and O(1) work per answer, where waiting on every
        # future at once costs O(calls in flight) per answer, O(n^2) over a phase.
        self.answers: queue.SimpleQueue[Future[None]] = queue.SimpleQueue()

    def run(self) -> Outcome:
        with self.cluster.threads_writing():
            for namespace, name, grace in self.plan.deletions:
                self._send(Call(0, "delete", (namespace, name, grace)))
            for job_id, pods in self.plan.pods.items():
                self.left[job_id] = len(pods)
                for pod in pods:
                    self.cluster.admitting(pod)
                    self._send(Call(job_id, "create", pod))
            while self.waiting:
                self._wait()
        self.hook("bound")
        return self.out

    def _send(self, call: Call) -> None:
        cluster, out = self.cluster, self.out

        def send() -> None:
            if call.job_id in out.failed:
                raise _NotSent  # another pod of its gang failed: nothing more is sent for it
            if call.step == "create":
                cluster.create_from_thread(call.what)
            elif call.step == "bind":
                cluster.bind_from_thread(call.what)
            else:
                cluster.delete_from_thread(*call.what)

        self.waiting[call.future] = call
        call.future.add_done_callback(self.answers.put)
        cluster.calls.send(call, send)

    def _started(self) -> Iterator[tuple[Call, float]]:
        """The calls a thread runs and when each started, oldest first: those that lead
        `waiting`. A call started a moment before one sent ahead of it (two threads taking
        the next two) is found at the next wait."""
        for call in self.waiting.values():
            if call.started is None:
                return
            yield call, call.started

    def _wait(self) -> None:
        keeper = self.cluster.keeper
        monotonic = self.cluster.calls.monotonic
        timeout = keeper.lease.ttl_s / 12
        for _, started in self._started():  # the oldest, whose deadline comes first
            timeout = min(timeout, max(0.0, started + self.deadline_s - monotonic()) + 0.001)
            break
        done = []
        try:
            done.append(self.answers.get(timeout=timeout))
            while True:
                done.append(self.answers.get_nowait())
        except queue.Empty:
            pass
        keeper.keep_for_threads()  # LeaseLost when lost: the threads' next writes are refused
        for future in done:
            call = self.waiting.pop(future, None)
            if call is not None:  # else answered after its deadline: given up on already
                self._answered(call, future.exception())
        now = monotonic()
        late = [call for call, started in self._started() if now - started >= self.deadline_s]
        for call in late:
            del self.waiting[call.future]
            self._answered(call, BackendError(f"no answer within {self.deadline_s:g} s"))

    def _answered(self, call: Call, error: BaseException | None) -> None:
        if call.step == "delete":
            if isinstance(error, BackendError):
                log.warning("could not delete pod %s/%s: %s", *call.what[:2], error)
            elif error is not None:
                raise error
            return
        job_id, out = call.job_id, self.out
        if isinstance(error, _NotSent):
            return  # its job failed already, and nothing more is sent for it
        if error is not None:
            if not isinstance(error, BackendError | BindConflict):
                raise error  # LeaseLost, or a bug: the cycle ends here
            if job_id not in out.failed:
                out.failed[job_id] = self._why(call, error)
            if call.step == "create" and isinstance(error, BindConflict) and _foreign(error):
                out.foreign.add((call.what.namespace, call.what.name))
        elif call.step == "create":
            self.created[job_id].append(call.what)
            if call.what.held:
                out.admitted.add((call.what.namespace, call.what.name))
        self.left[job_id] -= 1
        if self.left[job_id] or job_id in out.failed:
            return
        if call.step == "create":
            self.hook("pods_created")
            # A workload's pods are bound once its controller has made them (reconcile).
            pods = [p for p in self.created[job_id] if not p.workload]
            if not self.cluster.creates_bound and pods:
                self.left[job_id] = len(pods)
                for pod in pods:
                    self._send(Call(job_id, "bind", pod))
                return
        out.bound[job_id] = self.plan.allocations[job_id]

    @staticmethod
    def _why(call: Call, error: BackendError | BindConflict) -> str:
        if call.step == "create":
            return f"creating pods failed: {error}"
        if isinstance(error, BindConflict):
            return _conflict(error)
        return f"binding failed: {error}"


def failed_pods(plan: Plan, out: Outcome) -> list[tuple[str, str, int]]:
    """The pods of the jobs that did not bind, deleted at the commit: Gantry's own whatever
    became of their calls (one never sent or unanswered may exist), but never a pod another
    owner holds under our name (`foreign`), nor a user's held pod this phase did not admit:
    its call failed or was never sent (a gang's other pod failed first), so it is the user's
    as it was, gated (a LeaderWorkerSet's pod made again under its name is a new workload's).
    A held pod it did admit is Gantry's now, and goes."""
    return [
        (p.namespace, p.name, 0)
        for j in out.failed
        for p in plan.pods.get(j, [])
        if (p.namespace, p.name) not in out.foreign
        and (not p.held or (p.namespace, p.name) in out.admitted)
    ]


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
    cluster.delete_pods(failed_pods(plan, out))
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
