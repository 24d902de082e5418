"""Reconcile's judgement of a companion pod that failed or never starts (issue 37,
docs/kubernetes-native.md, "A companion that fails").

A companion (`scheduler.daemon.companions`: a RayJob's CPU head, CPU worker group or
submitter, a JobSet's driver, a PyTorchJob's CPU Master, a TrainJob's initializer) is no
replica, so the judge of a job's replicas never looks at it. One whose pod ends Failed (an
OOM kill, a non-zero exit with `restartPolicy: Never`, an eviction) while its attempt is
placed (binding or running, the pod on that attempt's replica 0's node) is a fault, and what
follows is its operator's to decide, per kind (`OPERATORS`, read in each operator's source),
and Gantry tells the user:

- KubeRay deletes a head or worker pod that ended (`shouldDeletePod`) and makes it again, and
  its submitter Job retries up to its `backoffLimit` before the RayJob fails;
- a JobSet's driver Job makes its pod again up to its `backoffLimit`, then the JobSet's
  `failurePolicy` fails the JobSet (or restarts every Job); so for a TrainJob's initializers
  (its runtime's JobSet);
- the training operator fails a PyTorchJob whose Master failed (its default `cleanPodPolicy:
  None` leaves the Workers running), and the workload controller fails the job with its
  object, as it fails any running job whose object failed.

A companion that cannot pull its image stays Pending (never Failed), and no operator ends an
object whose pod never starts: past the binding deadline after its attempt's replica 0 was
bound, it ends the attempt whatever the kind (`Fault.ends`), as a replica's pod would (an
image that cannot be pulled is not retried: `judge.FINAL`).

Telling is the job's reason (written here, fenced, with an event on the job): the workload
controller tells each change of a job's reason as an event on the object, and keeps it in
the object's `gantry.io/reason` annotation (`scheduler/workloads/controller.py`).

A companion of a JobSet or a PyTorchJob names no attempt, so a Failed pod an older attempt
left on the same node is judged again for the new one: its operator keeps a Failed pod until
the object is deleted (told again, harmless; a PyTorchJob's Failed Master failed the object
for good anyway).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Protocol, runtime_checkable

from scheduler.backends.base import FailureReason, PodPhase, PodStatus
from scheduler.daemon.workloads import workload_of
from scheduler.jobs.transitions import insert_events
from scheduler.models import Job, JobState

S = JobState
Row = Mapping[str, Any]
# The states in which a companion's failure is judged: its attempt placed and bound.
JUDGED = frozenset({S.BINDING, S.RUNNING})
COMPANION_FAILED = "companion_failed"  # the kind of the job's event that tells it
NEVER_STARTS = "no operator ends an object whose pod never starts"


# What each kind's operator does when a companion's pod fails, in the user's words: by the
# workload's plural, then by companion label where the kind's parts differ ("" for any other
# part of the kind). Gantry only tells: each of them ends the object, or makes the pod again.
OPERATORS: dict[str, dict[str, str]] = {
    "rayjobs": {
        "": "KubeRay makes it again; the RayJob fails if its Ray job is lost",
        "submitter": "KubeRay's submitter Job retries up to its backoffLimit, then the RayJob "
        "fails",
    },
    "jobsets": {
        "": "its Job makes it again up to its backoffLimit, then the JobSet's failurePolicy "
        "fails or restarts the JobSet",
    },
    "trainjobs": {"": "its Job retries up to its backoffLimit, then the TrainJob fails"},
    "pytorchjobs": {"": "the training operator fails the PyTorchJob, and its job with it"},
}


@runtime_checkable
class FailuresKept(Protocol):
    """A backend that keeps the companion pods it saw Failed for a while after they went
    (Kubernetes: the pod informer's `failed_gone`): an operator may delete a failed
    companion's object between two cycles, and its failure is still told."""

    def failed_companions(self) -> Sequence[PodStatus]: ...


def with_gone(backend: object, pods: Mapping[str, PodStatus]) -> Mapping[str, PodStatus]:
    """`pods` and, where the backend keeps them, the failed companions that went, for the
    judgement of companions alone (a pod still there wins)."""
    if not isinstance(backend, FailuresKept):
        return pods
    gone = {p.name: p for p in backend.failed_companions() if p.name not in pods}
    return {**pods, **gone} if gone else pods


@dataclass(frozen=True)
class Fault:
    """A placed job's faulty companion pod: what the user is told, and whether the attempt
    ends (one that never starts; `reason` is then the attempt's failure reason)."""

    job_id: int
    text: str
    reason: FailureReason
    ends: bool


def companion_faults(
    allocs: Sequence[Row],
    jobs: Mapping[int, Row],
    pods: Mapping[str, PodStatus],
    now: datetime,
    deadline: timedelta,
) -> dict[int, Fault]:
    """The first faulty companion (by pod name) of each job placed on its nodes, by job id:
    Failed, or pulling its image past `deadline` after replica 0 was bound (`now`: the
    daemon's clock). A pod not on its attempt's replica 0's node (not bound by Gantry, an
    older cluster's elsewhere) is not its job's concern."""
    heads = {
        (a["job_id"], a["attempt"]): (a["node__name"], a["bound_at"])
        for a in allocs
        if a["replica"] == 0 and not a["end_reason"]
    }
    faults: dict[int, Fault] = {}
    for pod in sorted(pods.values(), key=lambda p: p.name):
        job = jobs.get(pod.job_id)
        if not pod.companion or pod.deleting or job is None or pod.job_id in faults:
            continue
        if job["state"] not in JUDGED or pod.attempt not in (-1, job["attempt"]):
            continue
        node, bound_at = heads.get((pod.job_id, job["attempt"]), (None, None))
        if pod.node is None or node != pod.node:
            continue
        if pod.phase == PodPhase.FAILED:
            fault = _fault(job, pod, "failed")
        elif _stuck(pod) and bound_at is not None and now - bound_at > deadline:
            late = f"cannot pull its image {deadline.total_seconds():.0f} s after binding"
            fault = _fault(job, pod, late, ends=True)
        else:
            continue
        if fault is not None:
            faults[pod.job_id] = fault
    return faults


def _stuck(pod: PodStatus) -> bool:
    return pod.phase == PodPhase.PENDING and pod.reason == FailureReason.IMAGE_PULL


def _fault(job: Row, pod: PodStatus, what: str, *, ends: bool = False) -> Fault | None:
    plural = workload_of(job).partition("/")[0]
    kind = OPERATORS.get(plural)
    if kind is None:
        return None
    reason = pod.reason or FailureReason.ERROR
    detail = f"{reason}: {pod.message}" if pod.message else str(reason)
    then = NEVER_STARTS if ends else kind.get(pod.companion) or kind[""]
    text = f"its {part(plural, pod.companion)} pod {pod.name} {what} ({detail}); {then}"
    return Fault(pod.job_id, text, reason, ends)


def part(plural: str, companion: str) -> str:
    """The companion as its kind's users call it."""
    if plural == "rayjobs":
        if companion.startswith("worker-group-"):
            return f"Ray worker group '{companion.removeprefix('worker-group-')}'"
        return f"Ray {companion}"
    if plural == "pytorchjobs":
        return companion.capitalize()  # Master
    if plural == "jobsets":
        return f"replicated job '{companion}'"
    return companion  # a TrainJob's dataset-initializer, model-initializer


def tell(faults: Sequence[Fault], jobs: Mapping[int, Row], now: datetime) -> int:
    """Write each fault's text as its job's reason, with an event, unless the job's state or
    attempt changed meanwhile or its reason says it already. Inside the caller's fenced
    transaction. Returns the jobs written."""
    events = []
    for fault in faults:
        job = jobs[fault.job_id]
        written = (
            Job.objects.filter(pk=fault.job_id, state=job["state"], attempt=job["attempt"])
            .exclude(reason=fault.text[:500])
            .update(reason=fault.text[:500], updated_at=now)
        )
        if written:
            events.append((fault.job_id, COMPANION_FAILED, job["state"], job["state"], fault.text))
    insert_events(events)
    return len(events)
