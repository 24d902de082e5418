"""Jobs that need approval: which policies a job matches, and settling job requests.

`tenants.approvals` owns requests and their one decide path (`approval_decide`); this module
supplies what only the scheduler knows (a job's size, runtime and borrowing) and the handler
that moves the job when its request is settled, registered at start-up by `scheduler.apps`.
"""

from __future__ import annotations

from typing import Any

from common.errors import ConflictError
from scheduler.jobs.enqueue import job_enqueue
from scheduler.jobs.hooks import Verdict, approving_verdicts
from scheduler.jobs.transitions import job_transition
from scheduler.models import Job, JobEvent, JobState
from scheduler.snapshot.quota_usage import usage_by_tenant
from tenants.approval_rules import RuleMatch, job_matches, policies_applying
from tenants.approvals import register_subject_handler
from tenants.models import (
    ApprovalKind,
    ApprovalRequest,
    ApprovalRule,
    ApprovalState,
    Quota,
    Tenant,
)


def job_gpu_milli(job: Job) -> int:
    return job.replicas * job.gpu_milli_per_replica


def job_runtime_s(job: Job) -> int | None:
    """The runtime approval rules reason about: the maximum, which the daemon enforces (the
    pod's deadline, and the job fails past it); None when unbounded. The submitter's
    `estimated_runtime_s` is never used: nothing enforces it, so a short one would dodge the
    runtime and GPU-hour rules."""
    return job.max_runtime_s


def job_attempts_max(job: Job) -> int:
    """The most attempts the job may make: its retry limit + 1. Each attempt gets a fresh
    maximum runtime (the daemon requeues a failed attempt while retries are left), so this
    multiplies the most it may use and cost."""
    retry = (job.spec or {}).get("retry") if isinstance(job.spec, dict) else None
    return int((retry or {}).get("limit") or 0) + 1


def job_replicas_max(job: Job) -> int:
    """The most replicas the job may run at once: an inference job may scale up to its
    `max_replicas`; every other job runs its `replicas`."""
    spec = job.spec if isinstance(job.spec, dict) else {}
    return max(job.replicas, int(spec.get("max_replicas") or 0))


def job_estimated_gpu_hours(job: Job) -> float | None:
    """The most GPU-hours the job may use, the worst case: (retry limit + 1) attempts x the
    maximum runtime x the most replicas x the GPUs of one / 3600; None when its runtime is
    unbounded."""
    runtime = job_runtime_s(job)
    if runtime is None:
        return None
    gpus = job_replicas_max(job) * job.gpu_milli_per_replica / 1000
    return gpus * runtime * job_attempts_max(job) / 3600


def job_borrows(job: Job, *, lock: bool = True) -> bool:
    """Would the job take its team beyond the guarantee of every flavor it may run on?

    Usage is the team's subtree's, as the engine charges it and the portal shows it
    (`scheduler.snapshot.quota_usage.usage_by_tenant`): the GPUs its jobs hold, on the flavor of
    each allocation, and its jobs that claim GPUs without holding any yet (queued, preempted:
    `CLAIMING_STATES`) against each flavor they allow. Jobs waiting for their own approval
    do not count (their borrowing is decided with them).

    Called inside the submit's transaction: the tenant's row is locked first, so that jobs
    submitted at the same moment are judged one after another, each seeing the others.
    A quote passes `lock=False`: it decides nothing, so it need not wait for a submit, nor
    hold up one.
    """
    milli = job_gpu_milli(job)
    if milli == 0 or not job.priority_class.counts_against_quota:
        return False
    if lock:
        list(Tenant.objects.select_for_update().filter(pk=job.tenant_id).values_list("pk"))
    guaranteed = {
        name: g
        for name, g in Quota.objects.filter(tenant=job.tenant, cluster__isnull=True).values_list(
            "flavor__name", "guaranteed_milli"
        )
    }
    candidates = list(job.flavors) or list(guaranteed)
    if not candidates:
        return True  # no quota for any flavor: every GPU would be borrowed
    usage = usage_by_tenant([job.tenant], claiming=True, any_flavor=candidates, exclude_job=job.pk)[
        job.tenant.pk
    ]
    return all(usage.get(name, 0) + milli > guaranteed.get(name, 0) for name in candidates)


def job_approval_matches(job: Job, *, lock: bool = True) -> list[RuleMatch]:
    """The policies the (possibly unsaved) job matches; empty means no approval needed.
    With `lock=False` (a quote) nothing is locked, so it may run outside a transaction."""
    policies = policies_applying(job.tenant, jobs=True)
    if not policies:
        return []
    borrowing = any(p.rule == ApprovalRule.BORROWING for p in policies) and job_borrows(
        job, lock=lock
    )
    runtime = job_runtime_s(job)
    return job_matches(
        tenant=job.tenant,
        gpus_milli=job_gpu_milli(job),
        est_gpu_hours=job_estimated_gpu_hours(job),
        priority_value=job.priority_class.value,
        borrowing=borrowing,
        runtime_hours=None if runtime is None else runtime / 3600,
    )


def job_approval_payload(job: Job) -> dict[str, Any]:
    """What an approver sees of the job without opening it."""
    hours = job_estimated_gpu_hours(job)
    return {
        "title": f"job {job.name}",
        "job_name": job.name,
        "project": job.project.slug,
        "job_type": job.job_type,
        "gpus": job_gpu_milli(job) / 1000,
        "est_gpu_hours": None if hours is None else round(hours, 3),
        "priority_class": job.priority_class.name,
        "max_runtime_s": job.max_runtime_s,
    }


# --- settling ----------------------------------------------------------------------------


def job_request_settle(*, request: ApprovalRequest, outcome: str, actor: Any) -> None:
    """Move the job of a settled request; runs inside the deciding transaction.

    An approval of a job that no longer waits (cancelled meanwhile) is a ConflictError, so
    the decision rolls back; a rejection or expiry of such a job changes nothing more.
    """
    job = Job.objects.filter(pk=request.subject_id).first()
    if job is None or job.state != JobState.PENDING_APPROVAL:
        if outcome == ApprovalState.APPROVED:
            state = job.state if job else "gone"
            raise ConflictError(f"Job {request.subject_id} is {state}; it no longer waits.")
        return
    who = actor.get_username() if actor is not None else "the system"
    note = f": {request.comment}" if request.comment else ""
    if outcome == ApprovalState.APPROVED:
        # Judged again now (budgets may have filled since submit); may refuse (raises).
        _class_move(job, approving_verdicts(job, request))
        # No reason given: the one the job waited with is cleared in the same write.
        job_enqueue(
            job,
            actor=actor,
            kind="approved",
            message=f"Approved by {who}{note}",
            data={"approval": request.pk},
        )
    elif outcome in (ApprovalState.REJECTED, ApprovalState.EXPIRED):
        reason = (
            "approval expired" if outcome == ApprovalState.EXPIRED else f"rejected by {who}{note}"
        )
        job_transition(
            job=job,
            to_state=JobState.REJECTED,
            actor=actor,
            kind=outcome,
            message=reason,
            data={"approval": request.pk},
            reason=reason,
        )


def _class_move(job: Job, verdicts: list[Verdict]) -> None:
    """Apply an approving check's move to another priority class (a budget's best-effort
    policy), with its event, before the job is queued."""
    moved = next((v for v in verdicts if v.priority_class is not None), None)
    if moved is None or moved.priority_class is None:
        return
    job.priority_class = moved.priority_class
    job.spec = {**job.spec, "priority_class": moved.priority_class.name}
    Job.objects.filter(pk=job.pk).update(priority_class=job.priority_class, spec=job.spec)
    JobEvent.objects.create(
        job=job, kind="priority_class", to_state=job.state, message=moved.reason
    )


def register() -> None:
    register_subject_handler(ApprovalKind.JOB, job_request_settle)
