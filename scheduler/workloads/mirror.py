"""A held workload mirrored into a Gantry job, and the job's end when the workload is deleted
(issue 37).

The job is submitted through `job_submit`, as the portal and the API submit, by the Gantry user
the webhook's annotation names (the user the API server authenticated): quotas, approvals,
budgets, image rules, billing and audit apply unchanged. Its project is the one whose
namespace the workload was created in. The workload is recorded in the job's spec
(`spec["workload"]`: kind, namespace, name, uid, and for pods the pod of each replica), which
no user can set (the spec refuses unknown fields), and it is what makes the daemon admit the
user's pods instead of creating its own.

Mirroring is idempotent: one object is one job, whatever restarts or repeats (the uid is the
submission's idempotency key, and an object already mirrored is found by its uid first).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from django.contrib.auth import get_user_model
from django.core.exceptions import PermissionDenied
from rest_framework.exceptions import APIException, ValidationError

from common.db.shared_reads import shared
from common.errors import DomainError
from scheduler.backends.base import pod_name
from scheduler.jobs.services import job_cancel, job_submit
from scheduler.jobs.transitions import job_transition
from scheduler.models import FINAL_STATES, Allocation, Job, JobState
from scheduler.workloads.kinds import at
from scheduler.workloads.mutate import ANNOTATION_SUBMITTED_BY
from scheduler.workloads.shape import (
    LABEL_FLAVOR,
    LABEL_JOB_TYPE,
    LABEL_PRIORITY,
    Refused,
    Shaped,
    shape_job,
    shape_pods,
)
from tenants.models import Project

log = logging.getLogger("gantry.workloads")
Obj = dict[str, Any]


@dataclass(frozen=True)
class Mirrored:
    job: Job
    created: bool


def workload_uid(pods: Sequence[Obj]) -> str:
    """The identity of a single pod or a pod group: the uid of its first pod by name (a group
    deleted and made again under the same name is a new workload)."""
    first = min(pods, key=lambda p: str(at(p, ("metadata", "name"))))
    return str(at(first, ("metadata", "uid")))


def mirrored_job(uid: str) -> Job | None:
    return Job.objects.filter(spec__workload__uid=uid).order_by("id").first()


def mirrored_jobs(uids: Sequence[str]) -> dict[str, Job]:
    """The job of each of `uids` mirrored before (the first, as `mirrored_job` finds it), in
    one read: a pass looks up all it found held at once, not one round trip per object."""
    found: dict[str, Job] = {}
    for job in Job.objects.filter(spec__workload__uid__in=list(uids)).order_by("id"):
        found.setdefault(str(job.spec["workload"]["uid"]), job)
    return found


def _submitter(pod: Obj) -> Any:
    username = (at(pod, ("metadata", "annotations")) or {}).get(ANNOTATION_SUBMITTED_BY)
    if not username:
        raise Refused(
            "the object names no user (its creation was not reviewed by Gantry's webhook)"
        )
    user = _active_user(username)
    if user is None:
        raise Refused(
            f"{username!r}, who created it, is not a Gantry user: a platform admin adds the "
            "user with the same username"
        )
    return user


@shared
def _active_user(username: str) -> Any:
    return get_user_model().objects.filter(username=username, is_active=True).first()


@shared
def _project_of(namespace: str) -> Project | None:
    return Project.objects.filter(namespace=namespace).select_related("tenant").first()


# What the user wrote that each field of the job spec comes from (`shape._payload`): a
# refusal names it in the object's terms, not the spec's ("priority_class: unknown ...").
WRITTEN_AS = {
    "priority_class": f"the label {LABEL_PRIORITY}",
    "type": f"the label {LABEL_JOB_TYPE}",
    "flavors": f"the label {LABEL_FLAVOR}",
    "max_runtime_s": "activeDeadlineSeconds",
    "replicas": "its pods",
    "resources": "its pods' requests",
    "image": "its container's image",
    "command": "its container's command",
}


def _message(error: Exception) -> str:
    if isinstance(error, ValidationError):
        return _detail(error.detail)
    if isinstance(error, APIException):
        return str(error.detail)
    return str(error)


def _detail(detail: Any) -> str:
    """A validation error's detail in words, each field named as the user wrote it."""
    if isinstance(detail, dict):
        return "; ".join(
            f"{WRITTEN_AS.get(str(field), str(field))}: {_detail(v)}" for field, v in detail.items()
        )
    if isinstance(detail, list):
        return " ".join(_detail(v) for v in detail)
    return str(detail)


def mirror_pods(
    pods: Sequence[Obj],
    *,
    gpu_resource: str = "nvidia.com/gpu",
    owner: Obj | None = None,
    prior: Callable[[str], Job | None] = mirrored_job,
) -> Mirrored:
    """The job of a single held pod, or of a whole pod group: found when mirrored before (by
    `prior`, from the workload's uid), else submitted. `owner`: the LeaderWorkerSet whose
    group the pods are (its user submits, and the job is recorded as its). Raises Refused
    with what the user should read (no job is made)."""
    uid = workload_uid(pods)
    if (job := prior(uid)) is not None:
        return Mirrored(job, False)
    shaped = shape_pods(pods, gpu_resource)
    first = next(p for p in pods if str(at(p, ("metadata", "name"))) == shaped.pods[0])
    uids = {str(at(p, ("metadata", "name"))): str(at(p, ("metadata", "uid"))) for p in pods}
    workload = {
        "apiVersion": "v1",
        "kind": "Pod",
        "name": shaped.payload["name"],
        "uid": uid,
        "pods": list(shaped.pods),
        "uids": [uids[name] for name in shaped.pods],
    }
    if owner is not None:
        workload |= {
            "apiVersion": str(owner.get("apiVersion")),
            "kind": str(owner.get("kind")),
            "name": str(at(owner, ("metadata", "name"))),
        }
    return _submit(owner or first, shaped.payload, workload)


def mirror_job(job: Obj, *, gpu_resource: str = "nvidia.com/gpu") -> Mirrored:
    """The Gantry job of a held batch/v1 Job (found when mirrored before, else submitted)."""
    return mirror_object(job, lambda: shape_job(job, gpu_resource))


def mirror_object(
    obj: Obj, shape: Callable[[], Shaped], *, prior: Callable[[str], Job | None] = mirrored_job
) -> Mirrored:
    """The Gantry job of a held object Gantry resumes (a Job, JobSet, RayJob, TrainJob),
    found when mirrored before (by `prior`, from its uid), else shaped by `shape` and
    submitted."""
    uid = str(at(obj, ("metadata", "uid")))
    if (found := prior(uid)) is not None:
        return Mirrored(found, False)
    shaped = shape()
    name = str(at(obj, ("metadata", "name")))
    api_version, kind = str(obj.get("apiVersion")), str(obj.get("kind"))
    workload = {"apiVersion": api_version, "kind": kind, "name": name, "uid": uid}
    return _submit(obj, shaped.payload, workload)


def _submit(obj: Obj, payload: dict[str, Any], workload: dict[str, Any]) -> Mirrored:
    """Submit `payload` as the user `obj` names, to the project of its namespace, recording
    `workload` in the job's spec."""
    namespace = str(at(obj, ("metadata", "namespace")))
    project = _project_of(namespace)
    if project is None:
        raise Refused(f"namespace {namespace!r} is not a Gantry project's")
    user = _submitter(obj)
    workload = {**workload, "namespace": namespace}
    try:
        # Inserted with its workload: the daemon never reads the job without it.
        job, created = job_submit(
            user=user,
            project=project,
            payload=payload,
            idempotency_key=f"k8s:{workload['uid']}",
            workload=workload,
        )
    except (PermissionDenied, ValidationError, APIException, DomainError) as error:
        raise Refused(_message(error)) from error
    if created:
        log.info(
            "mirrored %s %s/%s as job %s", workload["kind"], namespace, workload["name"], job.pk
        )
    return Mirrored(job, created)


def end_deleted(job: Job, missing: str) -> Job | None:
    """Cancel the job of a workload deleted in Kubernetes (`missing`: "pod x", "Job y"; by
    its user, or with its namespace): its quota is freed, as a cancel from the portal frees
    it. None when the job had already ended."""
    if job.state in FINAL_STATES:
        return None
    try:
        return job_cancel(
            user=job.submitted_by, job=job, reason=f"its {missing} was deleted in Kubernetes"
        )
    except (APIException, DomainError) as error:  # ended meanwhile
        log.info("job %s not cancelled: %s", job.pk, _message(error))
        return None


def without_pods(jobs: Sequence[Job]) -> set[int]:
    """The ids of `jobs` none of whose current attempt's replicas has a pod yet: each of its
    live allocations still holds the stand-in name the daemon gave it (`pod_name`) until
    reconcile adopts a pod its object's controller made."""
    attempts = {job.pk: job.attempt for job in jobs}
    if not attempts:
        return set()
    rows = Allocation.objects.filter(job_id__in=list(attempts), ended_at__isnull=True)
    adopted = {
        job_id
        for job_id, attempt, replica, name in rows.values_list(
            "job_id", "attempt", "replica", "pod_name"
        )
        if attempt == attempts[job_id] and name != pod_name(job_id, attempt, replica)
    }
    return set(attempts) - adopted


def end_finished(job: Job, outcome: str, why: str = "") -> Job | None:
    """End the job of an object its controller marked `outcome` ("complete" or "failed"),
    saying `why` (its controller's message, if any): nothing is left to run. A running job
    ends as its object did (succeeded or failed: a RayJob's cluster outlives its job), and so
    does one that failed while admitted or binding (with no pod: the caller knows). One Gantry
    had admitted, then preempted or queued again, whose object completed succeeds: its pods
    finished before Gantry stopped them, and its work is done. Any other (failed while queued,
    complete while placed again, or complete without Gantry ever admitting it: run by someone
    else) is cancelled, saying what the object did."""
    if job.state in FINAL_STATES:
        return None
    kind = job.spec["workload"]["kind"]
    failed = f"its {kind} failed in Kubernetes" + (f": {why}" if why else "")
    try:
        placing = job.state in (JobState.ADMITTED, JobState.BINDING)
        if job.state == JobState.RUNNING or (placing and outcome == "failed"):
            return job_transition(
                job=job,
                to_state=JobState.SUCCEEDED if outcome == "complete" else JobState.FAILED,
                message=f"its {kind} is {outcome} in Kubernetes",
                reason=None if outcome == "complete" else failed,
            )
        stopped = job.state in (JobState.QUEUED, JobState.PREEMPTED)
        if outcome == "complete" and stopped and job.allocations.exists():
            return job_transition(
                job=job,
                to_state=JobState.SUCCEEDED,
                message=f"its {kind} is complete in Kubernetes: its pods finished before "
                "Gantry stopped them",
            )
        return job_cancel(
            user=job.submitted_by,
            job=job,
            reason=f"its {kind} is {outcome} in Kubernetes: its pods finished before Gantry "
            "stopped them",
        )
    except (APIException, DomainError) as error:  # ended meanwhile
        log.info("job %s not ended: %s", job.pk, _message(error))
        return None
