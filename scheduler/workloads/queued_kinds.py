"""The custom kinds the workload controller queues, one entry per kind (issue 37): how it is
listed, shaped into a job and read as ended; and a LeaderWorkerSet's pods grouped into gangs.

A JobSet, RayJob, TrainJob or PyTorchJob is mirrored like a batch/v1 Job: one object, one
job, admitted by unsuspending it (the daemon's side: `scheduler.backends.kubernetes.resume`). A
LeaderWorkerSet has no suspend flag: the webhook gates its pods as they are made, and each of
its groups (a leader and its workers, `spec.leaderWorkerTemplate.size` pods, one group per
replica index) is one pod group gang, admitted by removing the gates, exactly as a user's pod
group is (docs/kubernetes-native.md).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from scheduler.workloads.kinds import (
    JOB,
    JOBSET,
    LEADERWORKERSET,
    PYTORCHJOB,
    RAYJOB,
    TRAINJOB,
    Kind,
    at,
)
from scheduler.workloads.shape import Shaped, shape_job
from scheduler.workloads.shape_kinds import (
    shape_jobset,
    shape_pytorchjob,
    shape_rayjob,
    shape_trainjob,
)

Obj = dict[str, Any]
LWS_NAME = "leaderworkerset.sigs.k8s.io/name"
LWS_GROUP_INDEX = "leaderworkerset.sigs.k8s.io/group-index"


def _conditions(obj: Obj, complete: str) -> str | None:
    """ "complete" or "failed" when a True condition of type `complete` or Failed says so."""
    for condition in at(obj, ("status", "conditions")) or ():
        if isinstance(condition, dict) and condition.get("status") == "True":
            if condition.get("type") == complete:
                return "complete"
            if condition.get("type") == "Failed":
                return "failed"
    return None


def end_message(obj: Obj) -> str:
    """What the object's controller says of its end: the message of its True Failed (or
    complete) condition, else its `status.message` (a RayJob's); "" when it says nothing."""
    for condition in at(obj, ("status", "conditions")) or ():
        if (
            isinstance(condition, dict)
            and condition.get("status") == "True"
            and condition.get("type") in ("Failed", "Complete", "Completed", "Succeeded")
        ):
            return str(condition.get("message") or "")
    return str(at(obj, ("status", "message")) or "")


def _rayjob_ended(obj: Obj) -> str | None:
    """KubeRay's `status.jobDeploymentStatus`: Complete or Failed once its job has ended."""
    status = at(obj, ("status", "jobDeploymentStatus"))
    return {"Complete": "complete", "Failed": "failed"}.get(str(status))


@dataclass(frozen=True)
class Queued:
    """A kind the controller mirrors one object to one job."""

    kind: Kind
    shape: Callable[[Obj, str], Shaped]
    ended: Callable[[Obj], str | None]
    # Its pods outlive its end (a RayJob's cluster): a running job ends with the object.
    ends_running: bool = False

    @property
    def api_version(self) -> str:
        return f"{self.kind.group}/{self.kind.version}"


QUEUED = {
    q.kind.kind: q
    for q in (
        Queued(JOB, shape_job, lambda o: _conditions(o, "Complete")),
        Queued(JOBSET, shape_jobset, lambda o: _conditions(o, "Completed")),
        Queued(RAYJOB, shape_rayjob, _rayjob_ended, ends_running=True),
        Queued(TRAINJOB, shape_trainjob, lambda o: _conditions(o, "Complete")),
        # The training operator's conditions: Succeeded, or Failed.
        Queued(PYTORCHJOB, shape_pytorchjob, lambda o: _conditions(o, "Succeeded")),
    )
}
# Listed through the custom objects API (a Job through batch/v1).
CUSTOM = tuple(q for q in QUEUED.values() if q.kind is not JOB)


def is_lws_pod(pod: Obj) -> bool:
    return LWS_NAME in (at(pod, ("metadata", "labels")) or {})


def lws_groups(
    pods: Sequence[Obj], sets: Sequence[Obj]
) -> tuple[list[tuple[Obj, list[Obj]]], list[Obj]]:
    """The complete groups of LeaderWorkerSets' held pods, each with its set, by (namespace,
    set, group index): a group is complete once it has `spec.leaderWorkerTemplate.size`
    pods. And the pods of no set listed (a set deleted: its pods go with it)."""
    by_name = {(str(at(s, ("metadata", "namespace"))), _name(s)): s for s in sets}
    groups: dict[tuple[str, str, str], list[Obj]] = defaultdict(list)
    orphans = []
    for pod in pods:
        labels = at(pod, ("metadata", "labels")) or {}
        namespace = str(at(pod, ("metadata", "namespace")))
        if (namespace, labels.get(LWS_NAME)) not in by_name:
            orphans.append(pod)
            continue
        groups[(namespace, labels[LWS_NAME], str(labels.get(LWS_GROUP_INDEX)))].append(pod)
    complete = []
    for (namespace, name, _), members in sorted(groups.items()):
        owner = by_name[(namespace, name)]
        size = at(owner, ("spec", "leaderWorkerTemplate", "size"))
        if len(members) >= (size if isinstance(size, int) and size > 0 else 1):
            complete.append((owner, sorted(members, key=_name)))
    return complete, orphans


def _name(obj: Obj) -> str:
    return str(at(obj, ("metadata", "name")))


__all__ = [
    "CUSTOM",
    "LEADERWORKERSET",
    "QUEUED",
    "Queued",
    "end_message",
    "is_lws_pod",
    "lws_groups",
]
