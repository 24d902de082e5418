"""Pod objects (JSON dicts) -> PodStatus, with the reason a pod ended badly.

Where Kubernetes says why (in order of trust):
1. `status.reason` of the pod: Evicted (node pressure), DeadlineExceeded
   (activeDeadlineSeconds), NodeLost, and the kubelet's admission rejections (`OutOf<resource>`,
   `UnexpectedAdmissionError`, ...), which happen after a bind when the node's real state
   differs from what the scheduler believed.
2. The `DisruptionTarget` condition: preemption by a scheduler, eviction by the taint manager
   (node lost) or the kubelet.
3. Container states: OOMKilled, image pull failures, CrashLoopBackOff, a non-zero exit.
A reason can be present while the pod is still Pending (an image that never pulls): the
daemon decides when to give up on it, and says why with `waiting_cause` (the waiting
containers' reasons and messages, a PodScheduled=False condition).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from scheduler.backends.base import FailureReason, PodPhase, PodStatus
from scheduler.backends.kubernetes.render import (
    LABEL_ATTEMPT,
    LABEL_COMPLETION_INDEX,
    LABEL_JOB,
    LABEL_REPLICA,
)
from scheduler.backends.kubernetes.resume import (
    LABEL_COMPANION,
    LABEL_REPLICA_BASE,
    LABEL_REPLICA_STRIDE,
)

JOB_NAME = "batch.kubernetes.io/job-name"  # on the pods a Job's controller makes
JOBSET_JOB_INDEX = "jobset.sigs.k8s.io/job-index"  # on a JobSet's Jobs' pods: which Job
RAY_NODE_TYPE = "ray.io/node-type"  # on the pods KubeRay makes: head or worker
# On the pods Kubeflow's training operator makes (a PyTorchJob's): master or worker, and which.
KUBEFLOW_REPLICA_TYPE = "training.kubeflow.org/replica-type"
KUBEFLOW_REPLICA_INDEX = "training.kubeflow.org/replica-index"
_POD_REASONS = {
    "Evicted": FailureReason.EVICTED,
    "DeadlineExceeded": FailureReason.DEADLINE_EXCEEDED,
    "NodeLost": FailureReason.NODE_LOST,
    "Preempting": FailureReason.PREEMPTED,
    "Terminated": FailureReason.NODE_LOST,  # graceful node shutdown
    "Shutdown": FailureReason.NODE_LOST,
}
# Kubelet admission failures: the pod never started on the node it was bound to.
_REJECTIONS = ("OutOf", "UnexpectedAdmissionError", "NodeAffinity", "NodePorts", "Taint")
_DISRUPTIONS = {
    "PreemptionByScheduler": FailureReason.PREEMPTED,
    "PreemptionByKubeScheduler": FailureReason.PREEMPTED,
    "DeletionByTaintManager": FailureReason.NODE_LOST,
    "DeletionByPodGC": FailureReason.NODE_LOST,
    "EvictionByEvictionAPI": FailureReason.EVICTED,
    "TerminationByKubelet": FailureReason.EVICTED,
}
_WAITING = {
    "ErrImagePull": FailureReason.IMAGE_PULL,
    "ImagePullBackOff": FailureReason.IMAGE_PULL,
    "InvalidImageName": FailureReason.IMAGE_PULL,
    "ErrImageNeverPull": FailureReason.IMAGE_PULL,
    "CrashLoopBackOff": FailureReason.CRASH_LOOP,
}


def failure_reason(pod: Mapping[str, Any]) -> tuple[FailureReason | None, str]:
    """(reason, message) of one pod; (None, "") when nothing went wrong (yet)."""
    status = pod.get("status") or {}
    reason, message = status.get("reason") or "", status.get("message") or ""
    if reason in _POD_REASONS:
        return _POD_REASONS[reason], message
    if reason.startswith(_REJECTIONS):
        return FailureReason.REJECTED, message or reason
    for condition in status.get("conditions") or ():
        if condition.get("type") == "DisruptionTarget" and condition.get("status") == "True":
            found = _DISRUPTIONS.get(condition.get("reason", ""))
            if found:
                return found, condition.get("message") or ""
    return _container_reason(status.get("containerStatuses") or (), status.get("phase"))


def _container_reason(
    containers: Iterable[Mapping[str, Any]], phase: str | None
) -> tuple[FailureReason | None, str]:
    failed_exit: tuple[FailureReason | None, str] = (None, "")
    for container in containers:
        state = container.get("state") or {}
        last = container.get("lastState") or {}
        waiting = state.get("waiting") or {}
        if waiting.get("reason") in _WAITING:
            return _WAITING[waiting["reason"]], waiting.get("message") or ""
        terminated = state.get("terminated") or last.get("terminated") or {}
        if terminated.get("reason") == "OOMKilled":
            return FailureReason.OOM_KILLED, terminated.get("message") or "OOMKilled"
        if terminated.get("exitCode"):
            failed_exit = (
                FailureReason.ERROR,
                terminated.get("message") or f"exit code {terminated['exitCode']}",
            )
    if failed_exit[0] is None and phase == PodPhase.FAILED:
        return FailureReason.ERROR, ""
    return failed_exit


def waiting_cause(pod: Mapping[str, Any]) -> str:
    """Why a Pending pod has not started, from its init and app containers' waiting states
    (reason and message) and its conditions (PodScheduled=False); "" when nothing says."""
    status = pod.get("status") or {}
    causes = []
    for key in ("initContainerStatuses", "containerStatuses"):
        for container in status.get(key) or ():
            waiting = (container.get("state") or {}).get("waiting") or {}
            if waiting.get("reason"):
                causes.append(_cause(waiting, container.get("name")))
    for condition in status.get("conditions") or ():
        if condition.get("status") == "False" and condition.get("type") == "PodScheduled":
            causes.append(_cause(condition, None))
    return "; ".join(dict.fromkeys(causes))


def _cause(entry: Mapping[str, Any], container: str | None) -> str:
    where = f"container {container}: " if container else ""
    message = entry.get("message") or ""
    return f"{where}{entry.get('reason') or 'waiting'}" + (f": {message}" if message else "")


def _phase(value: str | None) -> PodPhase:
    try:
        return PodPhase(value or "Pending")
    except ValueError:
        return PodPhase.UNKNOWN


def _replica(labels: Mapping[str, str]) -> int:
    """Gantry's replica label; else, for a JobSet's pod, `base + job index * stride +
    completion index` from the labels Gantry put on its template (`resume.py`); for a
    PyTorchJob's, `base + replica index`; else its completion index; else -1 (adopted by a
    replica still waiting)."""
    if LABEL_REPLICA in labels:
        return int(labels[LABEL_REPLICA])
    if LABEL_REPLICA_BASE in labels and KUBEFLOW_REPLICA_INDEX in labels:
        return int(labels[LABEL_REPLICA_BASE]) + int(labels[KUBEFLOW_REPLICA_INDEX])
    index = int(labels.get(LABEL_COMPLETION_INDEX) or 0) if LABEL_COMPLETION_INDEX in labels else -1
    if LABEL_REPLICA_BASE in labels and JOBSET_JOB_INDEX in labels and index >= 0:
        stride = int(labels.get(LABEL_REPLICA_STRIDE) or 1)
        return int(labels[LABEL_REPLICA_BASE]) + int(labels[JOBSET_JOB_INDEX]) * stride + index
    return index


def pod_status(pod: Mapping[str, Any]) -> PodStatus | None:
    """Parse one pod; None for a pod without Gantry's job labels (not one of ours)."""
    metadata = pod.get("metadata") or {}
    labels = metadata.get("labels") or {}
    try:
        job_id = int(labels[LABEL_JOB])
        # A pod a Job's controller made (issue 37) has Gantry's job label from the Job's
        # template, but no attempt (a template's labels cannot change once the Job has run)
        # and no replica: -1, its completion index where it has one; reconcile adopts it.
        # So has a pod KubeRay made for a RayJob (a head or a worker, never a Job's), and one
        # the training operator made for a PyTorchJob.
        made = (JOB_NAME, RAY_NODE_TYPE, KUBEFLOW_REPLICA_TYPE)
        if LABEL_ATTEMPT not in labels and not any(key in labels for key in made):
            return None  # neither Gantry's own pod nor one a workload's controller made
        attempt = int(labels.get(LABEL_ATTEMPT, -1))
        # A companion (a RayJob's submitter, a TrainJob's initializer) goes with replica 0
        # and is no replica itself, whatever index its Job gives it.
        companion = str(labels.get(LABEL_COMPANION) or "")
        replica = 0 if companion else _replica(labels)
    except (KeyError, ValueError):
        return None
    phase = _phase((pod.get("status") or {}).get("phase"))
    reason, message = failure_reason(pod)
    if phase == PodPhase.SUCCEEDED:
        reason, message = None, ""
    return PodStatus(
        name=metadata.get("name", ""),
        namespace=metadata.get("namespace", ""),
        job_id=job_id,
        attempt=attempt,
        replica=replica,
        node=(pod.get("spec") or {}).get("nodeName") or None,
        phase=phase,
        reason=reason,
        message=message,
        deleting=bool(metadata.get("deletionTimestamp")),
        waiting=waiting_cause(pod) if phase == PodPhase.PENDING else "",
        companion=companion,
    )
