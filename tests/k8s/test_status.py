"""Pod objects -> PodStatus, and the failure reasons the daemon retries on (docs/faults.md 16)."""

from __future__ import annotations

from typing import Any

import pytest

from scheduler.backends.base import FailureReason, PodPhase
from scheduler.backends.kubernetes.status import pod_status, waiting_cause

LABELS = {"gantry.io/job-id": "7", "gantry.io/attempt": "1", "gantry.io/replica": "0"}


def pod(status: dict[str, Any], **metadata: Any) -> dict[str, Any]:
    return {
        "metadata": {"name": "gantry-7-a1-r0", "namespace": "team-a", "labels": LABELS, **metadata},
        "spec": {"nodeName": "gpu-1"},
        "status": status,
    }


def terminated(reason: str, exit_code: int = 1, last: bool = False) -> dict[str, Any]:
    state = {"terminated": {"reason": reason, "exitCode": exit_code}}
    key = "lastState" if last else "state"
    return {"containerStatuses": [{"name": "main", key: state}]}


def waiting(reason: str) -> dict[str, Any]:
    return {"containerStatuses": [{"name": "main", "state": {"waiting": {"reason": reason}}}]}


def disruption(reason: str) -> dict[str, Any]:
    return {"conditions": [{"type": "DisruptionTarget", "status": "True", "reason": reason}]}


CASES = {
    "oom": ({"phase": "Failed", **terminated("OOMKilled", 137)}, FailureReason.OOM_KILLED),
    "oom-restarted": ({"phase": "Running", **terminated("OOMKilled", 137, last=True)},
                      FailureReason.OOM_KILLED),
    "evicted": ({"phase": "Failed", "reason": "Evicted", "message": "low on memory"},
                FailureReason.EVICTED),
    "image-pull": ({"phase": "Pending", **waiting("ErrImagePull")}, FailureReason.IMAGE_PULL),
    "image-backoff": ({"phase": "Pending", **waiting("ImagePullBackOff")},
                      FailureReason.IMAGE_PULL),
    "invalid-image": ({"phase": "Pending", **waiting("InvalidImageName")},
                      FailureReason.IMAGE_PULL),
    "crash-loop": ({"phase": "Running", **waiting("CrashLoopBackOff")},
                   FailureReason.CRASH_LOOP),
    "deadline": ({"phase": "Failed", "reason": "DeadlineExceeded"},
                 FailureReason.DEADLINE_EXCEEDED),
    "node-lost": ({"phase": "Unknown", "reason": "NodeLost"}, FailureReason.NODE_LOST),
    "taint-eviction": ({"phase": "Running", **disruption("DeletionByTaintManager")},
                       FailureReason.NODE_LOST),
    "kubelet-rejected-gpu": ({"phase": "Failed", "reason": "OutOfnvidia.com/gpu",
                              "message": "Pod was rejected: Node didn't have enough resource"},
                             FailureReason.REJECTED),
    "kubelet-admission-error": ({"phase": "Failed", "reason": "UnexpectedAdmissionError"},
                                FailureReason.REJECTED),
    "preempted": ({"phase": "Running", **disruption("PreemptionByScheduler")},
                  FailureReason.PREEMPTED),
    "exit-code": ({"phase": "Failed", **terminated("Error", 2)}, FailureReason.ERROR),
    "failed-unexplained": ({"phase": "Failed"}, FailureReason.ERROR),
    "running": ({"phase": "Running"}, None),
    "succeeded": ({"phase": "Succeeded", **terminated("Completed", 0)}, None),
    "pending": ({"phase": "Pending"}, None),
}  # fmt: skip


@pytest.mark.parametrize(("status", "reason"), CASES.values(), ids=CASES.keys())
def test_failure_reason_mapping(status: dict[str, Any], reason: FailureReason | None) -> None:
    parsed = pod_status(pod(status))
    assert parsed is not None
    assert parsed.reason == reason


def test_fields() -> None:
    parsed = pod_status(
        pod({"phase": "Failed", "reason": "Evicted", "message": "disk"}, deletionTimestamp="t")
    )
    assert parsed is not None
    assert (parsed.job_id, parsed.attempt, parsed.replica) == (7, 1, 0)
    assert (parsed.node, parsed.phase, parsed.message) == ("gpu-1", PodPhase.FAILED, "disk")
    assert parsed.deleting


def test_unbound_and_unknown_phase() -> None:
    raw = pod({"phase": "Weird"})
    raw["spec"] = {}
    parsed = pod_status(raw)
    assert parsed is not None and parsed.node is None and parsed.phase == PodPhase.UNKNOWN


@pytest.mark.parametrize(
    "labels", [{}, {**LABELS, "gantry.io/job-id": "x"}, {"gantry.io/job-id": "7"}]
)
def test_pods_without_our_labels_are_skipped(labels: dict[str, str]) -> None:
    raw = pod({"phase": "Running"})
    raw["metadata"]["labels"] = labels
    assert pod_status(raw) is None


def _waiting(reason: str, message: str) -> dict[str, Any]:
    state = {"waiting": {"reason": reason, "message": message}}
    return {"containerStatuses": [{"name": "main", "state": state}]}


# What a pod that never starts says (issue 17: the daemon fails its attempt at the binding
# deadline with this cause).
WAITING = {
    "image-pull-back-off": (
        {"phase": "Pending", **_waiting("ImagePullBackOff", 'Back-off pulling image "x:1"')},
        'container main: ImagePullBackOff: Back-off pulling image "x:1"',
    ),
    "missing-secret": (
        {"phase": "Pending",
         **_waiting("CreateContainerConfigError", 'secret "hf-token" not found')},
        'container main: CreateContainerConfigError: secret "hf-token" not found',
    ),
    "unschedulable": (
        {"phase": "Pending", "conditions": [
            {"type": "PodScheduled", "status": "False", "reason": "Unschedulable",
             "message": "0/2 nodes are available: 2 Insufficient nvidia.com/gpu."}]},
        "Unschedulable: 0/2 nodes are available: 2 Insufficient nvidia.com/gpu.",
    ),
    "init-container": (
        {"phase": "Pending", "initContainerStatuses": [
            {"name": "fetch", "state": {"waiting": {"reason": "ErrImagePull"}}}]},
        "container fetch: ErrImagePull",
    ),
    "just-pending": ({"phase": "Pending"}, ""),
    "running-is-not-waiting": ({"phase": "Running", **_waiting("CrashLoopBackOff", "")}, ""),
}  # fmt: skip


@pytest.mark.parametrize(("status", "cause"), WAITING.values(), ids=WAITING.keys())
def test_a_pending_pod_reports_why_it_has_not_started(status: dict[str, Any], cause: str) -> None:
    parsed = pod_status(pod(status))
    assert parsed is not None
    assert parsed.waiting == cause
    if status["phase"] == "Pending":
        assert waiting_cause(pod(status)) == cause
