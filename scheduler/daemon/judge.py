"""Reconcile's verdicts: what a job's pods say about it (started, succeeded, failed and
why, a crashed claim to adopt or release), written as state changes; and the sweeps that
requeue preempted jobs and release claims lost by a dead daemon."""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from django.db.models import Count

from scheduler.backends.base import FailureReason, PodPhase, PodStatus
from scheduler.daemon.history import requeue_standing
from scheduler.daemon.store import release
from scheduler.jobs.transitions import Change, transition
from scheduler.models import (
    Allocation,
    Job,
    JobEvent,
    JobState,
)
from scheduler.snapshot.rows import holds_allocation

log = logging.getLogger("gantry.daemon")
S = JobState


F = FailureReason


# Not the job's fault: retried whatever its policy, up to INFRA_ATTEMPTS attempts.
INFRA = frozenset({F.NODE_LOST, F.EVICTED, F.PREEMPTED, F.REJECTED})


INFRA_ATTEMPTS = 10


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


@dataclass(slots=True)
class Verdict:
    """What reconcile decided for one job."""

    start: bool = False  # binding -> running
    adopt: list[tuple[str, str, str]] = field(default_factory=list)  # ns, pod, node to bind
    adopted: bool = False
    release_claim: bool = False
    succeeded: bool = False
    failure: tuple[FailureReason, str] | None = None

    @property
    def idle(self) -> bool:
        """Nothing to do: the job goes on as it is (most running jobs, most cycles)."""
        return not (
            self.start or self.adopted or self.release_claim or self.succeeded or self.failure
        )


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
    went = False  # a pod running or done
    core = done = 0  # the gang's pods (not elastic replicas), and those of them succeeded
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
        else:
            succeeded = pod.phase == PodPhase.SUCCEEDED
            went = went or succeeded or pod.phase == PodPhase.RUNNING
            if not a["elastic"]:
                core += 1
                done += succeeded
        if verdict.failure:
            return verdict
    verdict.start = went and job["state"] == S.BINDING
    verdict.succeeded = core > 0 and done == core
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


def apply_verdicts(
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
    if adopted:
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
    counts = (
        dict(
            JobEvent.objects.filter(job_id__any=list(failures), kind="attempt_failed")
            .values_list("job_id")
            .annotate(n=Count("id"))
        )
        if failures
        else {}
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
    done = transition(changes, now).done
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
    if stopping:
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
        data: dict[str, Any] = {"reason": str(reason)}
        if reason == F.NODE_LOST:  # what the owner's "requeued" notification says
            data["detail"] = detail
            if infra:
                data["retries_max"] = INFRA_ATTEMPTS - 1
        return Change(
            job["id"],
            (S.BINDING, S.RUNNING),
            S.QUEUED,
            new_attempt=True,
            not_before=now + timedelta(seconds=delay),
            kind="attempt_failed",
            message=f"Attempt {job['attempt']} failed: {why}; retrying in {delay} s{tries}.",
            reason=f"attempt {job['attempt']} failed: {why}; retry in {delay} s",
            data=data,
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
    return len(transition(changes, now).done)


def requeue_preempted(now: datetime, among: Sequence[int] | None = None) -> int:
    """Preempted jobs (of `among`, or all) with nothing left running go back to the queue,
    attempt raised."""
    preempted = Job.objects.filter(state=S.PREEMPTED)
    if among is not None:
        preempted = preempted.filter(id__any=among)
    rows = list(
        preempted.exclude(holds_allocation()).values(
            "id", "reason", "tenant_id", "priority_class_id", "created_at"
        )
    )
    # Where each stands once requeued, in its history and its reason (until the next
    # refresh of the reasons replaces it).
    standing = requeue_standing(rows)
    changes = [
        Change(
            r["id"],
            (S.PREEMPTED,),
            S.QUEUED,
            new_attempt=True,
            reason=f"requeued after preemption: {standing[r['id']]}",
            message=f"Back in the queue after preemption ({_why(r)}): {standing[r['id']]}.",
            data={"requeued_after": "preemption"},
        )
        for r in rows
    ]
    return len(transition(changes, now).done)


def _why(preempted: Mapping[str, Any]) -> str:
    """The preemption's cause, as the preempted job's reason says it."""
    return str(preempted["reason"]).removeprefix("preempted: ")
