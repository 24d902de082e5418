"""Writes users trigger on jobs: submit and cancel."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any

from django.core.exceptions import PermissionDenied
from django.db import IntegrityError, transaction
from rest_framework.exceptions import ValidationError

from common.errors import ConflictError
from scheduler.jobs.approvals import job_approval_matches, job_approval_payload
from scheduler.jobs.enqueue import job_enqueue
from scheduler.jobs.feasibility import job_check_fits
from scheduler.jobs.hooks import Verdict, submit_verdicts
from scheduler.jobs.spec import JobSpecSerializer
from scheduler.jobs.transitions import job_transition
from scheduler.models import FINAL_STATES, Job, JobEvent, JobState
from tenants import access
from tenants.approval_rules import RuleMatch
from tenants.approvals import approval_cancel_for_subject, approval_request_create
from tenants.audit import audit_record, audit_snapshot
from tenants.models import ApprovalKind, PriorityClass, Project
from tenants.registries import image_refusal
from tenants.selectors import priority_class_named
from tenants.services import priority_default_for

MAX_IDEMPOTENCY_KEY = 128
JOB_AUDIT_FIELDS = (
    "name",
    "project",
    "tenant",
    "job_type",
    "state",
    "priority_class",
    "replicas",
    "gpu_milli_per_replica",
    "flavors",
    "max_runtime_s",
    "spec",
)


def request_hash(project_id: int, payload: dict[str, Any]) -> str:
    """Fingerprint of what was asked, to tell a retry from a different request."""
    canonical = json.dumps({"project": project_id, "spec": payload}, sort_keys=True, default=str)
    return hashlib.sha256(canonical.encode()).hexdigest()


def _resolve_priority(project: Project, spec: dict[str, Any]) -> PriorityClass:
    if spec["priority_class"]:
        named = priority_class_named(spec["priority_class"])
        if named is None:  # removed since the spec was validated
            raise ValidationError({"priority_class": ["no such priority class."]})
        return named
    default = priority_default_for(tenant=project.tenant, job_type=spec["type"])
    if default is not None:
        return default
    fallback = PriorityClass.objects.order_by("value").filter(counts_against_quota=True).first()
    if fallback is None:
        raise ValidationError({"priority_class": ["no priority classes are configured."]})
    return fallback


def _job_from_spec(*, user: Any, project: Project, spec: dict[str, Any]) -> Job:
    res = spec["resources"]
    gpus = res["gpus"] or 0
    milli = gpus * 1000 if gpus else (res["gpu_milli"] or (1000 if res["mig_profile"] else 0))
    priority = _resolve_priority(project, spec)
    spec["priority_class"] = priority.name
    return Job(
        project=project,
        tenant=project.tenant,
        submitted_by=user,
        name=spec["name"],
        job_type=spec["type"],
        state=JobState.QUEUED,
        priority_class=priority,
        spec=spec,
        replicas=spec["replicas"],
        gpus_per_replica=gpus,
        gpu_milli_per_replica=milli,
        gpu_memory_mib=res["gpu_memory_mib"],
        cpu_milli=res["cpu_milli"],
        memory_mib=res["memory_mib"],
        flavors=spec["flavors"],
        max_runtime_s=spec["max_runtime_s"],
    )


def _existing_for_key(user: Any, key: str, fingerprint: str) -> Job | None:
    job = Job.objects.filter(submitted_by=user, idempotency_key=key).first()
    if job is not None and job.request_hash != fingerprint:
        raise ConflictError(
            f"Idempotency key {key!r} was already used for a different request (job {job.pk}); "
            "use a new key for a new job."
        )
    return job


def job_build(*, user: Any, project: Project, payload: dict[str, Any]) -> Job:
    """The unsaved job that submitting `payload` would queue, validated exactly as submit
    validates it (the same PermissionDenied and ValidationErrors); writes nothing, so a quote
    (billing.costs.quotes) prices and judges the very job submit would create."""
    if not access.can_submit(user, project):
        raise PermissionDenied(f"You may not submit jobs to project '{project.slug}'.")
    serializer = JobSpecSerializer(data=payload)
    serializer.is_valid(raise_exception=True)
    spec = dict(serializer.validated_data)
    # The image is fixed at submission (requeues and retries run the same spec), so this is
    # the one place a tenant's registries are enforced.
    refusal = image_refusal(tenant=project.tenant, image=spec["image"])
    if refusal:
        raise ValidationError({"image": [refusal]})
    job = _job_from_spec(user=user, project=project, spec=spec)
    job_check_fits(job=job, spec=spec)
    return job


@dataclass(frozen=True)
class Judgement:
    """What submit decides about a job before saving it."""

    approval: list[RuleMatch]  # reasons it must be approved; empty: it is queued
    verdicts: list[Verdict]  # the admission checks' words (payloads for the request)
    moved: Verdict | None  # the verdict that moved it to another priority class


def job_judge(job: Job, *, lock: bool = True) -> Judgement:
    """The approval rules, then the admission checks (budgets and cost rules, registered by
    billing in scheduler.jobs.hooks), as submit applies them; a class move is applied to the
    unsaved `job`. Submit calls it in its transaction (`lock`: see job_borrows); a quote
    calls it with lock=False and saves nothing."""
    approval = job_approval_matches(job, lock=lock)
    verdicts = submit_verdicts(job, lock=lock)
    approval += [match for v in verdicts for match in v.approvals]
    moved = next((v for v in verdicts if v.priority_class is not None), None)
    if moved is not None and moved.priority_class is not None:
        job.priority_class = moved.priority_class
        job.spec = {**job.spec, "priority_class": moved.priority_class.name}
    return Judgement(approval, verdicts, moved)


def job_submit(
    *,
    user: Any,
    project: Project,
    payload: dict[str, Any],
    idempotency_key: str | None = None,
    workload: dict[str, Any] | None = None,
) -> tuple[Job, bool]:
    """Validate `payload` and queue the job. Returns (job, created).

    With an idempotency key, a repeat of the same request returns the first job (created is
    False) and the same key with a different body is a ConflictError. Two identical requests
    racing are settled by the unique constraint on (submitted_by, idempotency_key).
    `workload`: the Kubernetes object the job mirrors (scheduler/workloads/mirror.py),
    recorded in its spec as it is inserted; no payload can set it (the spec refuses it).
    """
    if not access.can_submit(user, project):
        raise PermissionDenied(f"You may not submit jobs to project '{project.slug}'.")
    if idempotency_key is not None and not 1 <= len(idempotency_key) <= MAX_IDEMPOTENCY_KEY:
        raise ValidationError({"idempotency_key": [f"must be 1-{MAX_IDEMPOTENCY_KEY} characters."]})
    fingerprint = request_hash(project.pk, payload)
    if idempotency_key and (job := _existing_for_key(user, idempotency_key, fingerprint)):
        return job, False
    job = job_build(user=user, project=project, payload=payload)
    if workload is not None:
        job.spec = {**job.spec, "workload": workload}
    job.idempotency_key = idempotency_key
    job.request_hash = fingerprint
    try:
        with transaction.atomic():
            # Inside the transaction: the borrowing rule locks the tenant's row and counts
            # its queued jobs, so jobs submitted together are judged one after another.
            judged = job_judge(job)
            approval, verdicts, moved = judged.approval, judged.verdicts, judged.moved
            submitted = f"Submitted by {user.get_username()} to project {project.slug}."
            if approval:
                job.state = JobState.PENDING_APPROVAL
                reasons = "; ".join(m.reason for m in approval)
                job.reason = f"waiting for approval: {reasons}"[:500]
                job.save()
                JobEvent.objects.create(
                    job=job,
                    kind="submitted",
                    to_state=job.state,
                    actor=user,
                    message=f"{submitted} It is {job.reason}.",
                )
            else:
                if moved is not None:
                    job.reason = moved.reason[:500]
                job_enqueue(job, actor=user, kind="submitted", message=submitted)
            if moved is not None:
                JobEvent.objects.create(
                    job=job, kind="priority_class", to_state=job.state, message=moved.reason
                )
            if approval:
                payload = job_approval_payload(job)
                for verdict in verdicts:
                    payload.update(verdict.payload)
                approval_request_create(
                    requester=user,
                    tenant=job.tenant,
                    kind=ApprovalKind.JOB,
                    subject_id=job.pk,
                    payload=payload,
                    rules=approval,
                )
            audit_record(
                actor=user,
                action="job.submit",
                tenant=job.tenant,
                target=job,
                before=None,
                after=audit_snapshot(job, JOB_AUDIT_FIELDS),
            )
    except IntegrityError:
        if not idempotency_key:
            raise
        existing = _existing_for_key(user, idempotency_key, fingerprint)
        if existing is None:
            raise
        return existing, False
    return job, True


def can_cancel(user: Any, job: Job) -> bool:
    grants = access.grants_for(user)
    return (
        job.submitted_by_id == user.pk
        or grants.platform_admin
        or access.can_manage_tenant(user, job.tenant)
    )


def job_cancel(*, user: Any, job: Job, reason: str = "") -> Job:
    """Cancel a job in any non-final state; a concurrent transition is retried against."""
    if not can_cancel(user, job):
        raise PermissionDenied("Only the submitter or an admin of the team may cancel this job.")
    for _ in range(5):
        if job.state in FINAL_STATES:
            raise ConflictError(f"Job {job.pk} already {job.state}; it cannot be cancelled.")
        try:
            message = f"Cancelled by {user.get_username()}" + (f": {reason}" if reason else ".")
            with transaction.atomic():
                before = {"state": job.state}
                if job.state == JobState.PENDING_APPROVAL:
                    # The request first, then the job: the lock order of every decision.
                    approval_cancel_for_subject(
                        kind=ApprovalKind.JOB, tenant=job.tenant, subject_id=job.pk, actor=user
                    )
                job = job_transition(
                    job=job, to_state=JobState.CANCELLED, actor=user, message=message
                )
                audit_record(
                    actor=user,
                    action="job.cancel",
                    tenant=job.tenant,
                    target=job,
                    before=before,
                    after={"state": job.state, "reason": reason},
                )
            return job
        except ConflictError:
            job.refresh_from_db()
    raise ConflictError(f"Job {job.pk} kept changing state; try again.")
