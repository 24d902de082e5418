"""A job's pods (its allocations, current and past attempts) and reading one pod's log.

The caller has already checked that the viewer may see the job (`selectors.access_job`):
everything here is scoped by that job. Which pod: a replica (0 unless asked) of an attempt
(the latest that has pods unless asked). A job with no pods yet answers no lines and says
why, so that a client polling for a job to start needs no special case.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from django.db.models import Prefetch, QuerySet
from rest_framework.exceptions import ValidationError

from scheduler.backends.base import LogLine, LogSource, LogTarget, LogUnavailable
from scheduler.models import Allocation, AllocationDevice, Job, JobState

# The most lines a tail returns (and the default when none is asked for).
MAX_TAIL = 1000
DEFAULT_TAIL = 200


def job_pod_list(job: Job) -> QuerySet[Allocation]:
    """Every pod the job has had, the latest attempt first, with node and devices."""
    devices = AllocationDevice.objects.select_related("device").order_by("device__index")
    return (
        Allocation.objects.filter(job=job)
        .select_related("node")
        .prefetch_related(Prefetch("devices", queryset=devices))
        .order_by("-attempt", "replica", "-id")
    )


@dataclass(frozen=True)
class JobLog:
    """What a read of a job's log answers. `done`: the pod has ended and every line it wrote
    is in (a follower stops); `message`: why there are no lines, when there are none to read."""

    pod: Allocation | None
    lines: tuple[LogLine, ...]
    cursor: str
    done: bool
    message: str = ""


def _outcome(job: Job, pod: Allocation) -> str:
    if pod.ended_at is None:
        return "running"
    if pod.attempt != job.attempt:
        return "stopped"  # requeued: preempted, its node lost, or failed with retries left
    if job.state == JobState.SUCCEEDED:
        return "succeeded"
    if job.state == JobState.FAILED:
        return "oom" if "oom" in job.reason.lower() else "failed"
    return "stopped"


def log_target(job: Job, pod: Allocation) -> LogTarget:
    return LogTarget(
        namespace=pod.namespace,
        pod=pod.pod_name,
        job_id=job.pk,
        attempt=pod.attempt,
        replica=pod.replica,
        job_type=job.job_type,
        started_at=pod.bound_at or pod.started_at,
        ended_at=pod.ended_at,
        outcome=_outcome(job, pod),
        node=pod.node.name,
    )


def _pick(job: Job, replica: int, attempt: int | None) -> Allocation | None:
    """The pod of `replica` in `attempt` (the latest attempt with pods when None). A replica
    or attempt the job cannot have is bad input (400, with the field)."""
    pods = Allocation.objects.filter(job=job).select_related("node")
    replicas = max(job.replicas, int((job.spec or {}).get("max_replicas") or 0))
    if replica >= replicas:
        last = replicas - 1
        raise ValidationError({"replica": [f"job #{job.pk} has replicas 0 to {last}."]})
    if attempt is not None:
        if attempt > job.attempt:
            raise ValidationError(
                {"attempt": [f"job #{job.pk} has had attempts 0 to {job.attempt} only."]}
            )
        pods = pods.filter(attempt=attempt)
    return pods.filter(replica=replica).order_by("-attempt", "-id").first()


def _waiting_message(job: Job, attempt: int | None) -> str:
    if attempt is not None:
        return f"attempt {attempt} of job #{job.pk} had no pod for this replica."
    if job.is_final:
        return f"job #{job.pk} ended ({job.state}) without running a pod: there is no log."
    return f"job #{job.pk} has not started yet ({job.state}): its log begins when its pods run."


def job_log_read(
    *,
    job: Job,
    source: LogSource,
    now: datetime,
    replica: int = 0,
    attempt: int | None = None,
    tail: int | None = None,
    cursor: str = "",
) -> JobLog:
    """The last `tail` lines of the pod, or with `cursor` those after it. Raises
    ValidationError for a replica, attempt or cursor the job cannot have, and BackendError
    when the cluster cannot be asked (the caller answers 503)."""
    pod = _pick(job, replica, attempt)
    if pod is None:
        # An earlier attempt without a pod never gets one; the current one may, until final.
        done = job.is_final or (attempt is not None and attempt < job.attempt)
        return JobLog(None, (), cursor, done=done, message=_waiting_message(job, attempt))
    target = log_target(job, pod)
    try:
        page = source.read_log(target, now=now, tail=tail or DEFAULT_TAIL, cursor=cursor)
    except LogUnavailable as exc:
        return JobLog(pod, (), cursor, done=pod.ended_at is not None, message=str(exc))
    except ValueError as exc:  # a cursor this backend did not write
        raise ValidationError({"since": ["not a cursor from this log."]}) from exc
    done = pod.ended_at is not None and len(page.lines) < MAX_TAIL
    message = ""
    if not page.lines and pod.bound_at is None and pod.ended_at is None:
        # Kubernetes answers an unbound pod's log with nothing at all; say why.
        message = f"pod {pod.pod_name} has not been bound to a node yet."
    return JobLog(pod, page.lines, page.cursor, done=done, message=message)
