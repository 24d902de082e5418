"""The workload kinds Gantry holds at creation, and where each keeps its pod templates.

A kind is named by its API group and kind (the webhook is registered with
`matchPolicy: Equivalent`, so the API server may send any version it serves; the paths below
are the same in every served version of these kinds). Each kind lists:
- `suspend`: the path of its suspend flag, or None for a kind that has none (LeaderWorkerSet:
  its pods are gated instead);
- `pod_specs(obj)`: the paths of every pod spec its templates hold, found in the object (a
  JobSet's replicated jobs, a RayJob's head and worker groups), so that each gets Gantry's
  schedulerName.

A TrainJob holds no pod template of its own: its runtime's JobSet, created by the trainer
for it, is mutated as an owned object when it is created (`OWNED_THROUGH`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

Obj = dict[str, Any]
Path = tuple[str | int, ...]


@dataclass(frozen=True)
class Kind:
    group: str
    version: str  # the version the webhook is registered for (and the CRD stores)
    kind: str
    plural: str
    suspend: Path | None
    pod_specs: Callable[[Obj], list[Path]]

    @property
    def key(self) -> tuple[str, str]:
        return (self.group, self.kind)


def at(obj: Any, path: Path) -> Any:
    """The value at `path`, or None where any step is missing or of the wrong type."""
    for step in path:
        if isinstance(step, int):
            if not isinstance(obj, list) or step >= len(obj):
                return None
        elif not isinstance(obj, dict):
            return None
        obj = obj[step] if isinstance(step, int) else obj.get(step)
    return obj


def _specs(obj: Obj, candidates: list[Path]) -> list[Path]:
    """Of `candidates`, the paths where the object holds a pod spec (a mapping)."""
    return [path for path in candidates if isinstance(at(obj, path), dict)]


def _each(obj: Obj, listed: Path, inner: Path) -> list[Path]:
    """`inner` under every item of the list at `listed`."""
    items = at(obj, listed)
    count = len(items) if isinstance(items, list) else 0
    return [(*listed, i, *inner) for i in range(count)]


def _pod(obj: Obj) -> list[Path]:
    return _specs(obj, [("spec",)])


def _job(obj: Obj) -> list[Path]:
    return _specs(obj, [("spec", "template", "spec")])


def _jobset(obj: Obj) -> list[Path]:
    inner = ("template", "spec", "template", "spec")
    return _specs(obj, _each(obj, ("spec", "replicatedJobs"), inner))


def _pytorchjob(obj: Obj) -> list[Path]:
    replicas = at(obj, ("spec", "pytorchReplicaSpecs"))
    names = sorted(replicas) if isinstance(replicas, dict) else []
    return _specs(obj, [("spec", "pytorchReplicaSpecs", n, "template", "spec") for n in names])


def _rayjob(obj: Obj) -> list[Path]:
    cluster = ("spec", "rayClusterSpec")
    return _specs(
        obj,
        [
            (*cluster, "headGroupSpec", "template", "spec"),
            *_each(obj, (*cluster, "workerGroupSpecs"), ("template", "spec")),
            ("spec", "submitterPodTemplate", "spec"),
        ],
    )


def _leaderworkerset(obj: Obj) -> list[Path]:
    templates = ("spec", "leaderWorkerTemplate")
    return _specs(
        obj, [(*templates, "leaderTemplate", "spec"), (*templates, "workerTemplate", "spec")]
    )


def _none(obj: Obj) -> list[Path]:
    return []


POD = Kind("", "v1", "Pod", "pods", None, _pod)
JOB = Kind("batch", "v1", "Job", "jobs", ("spec", "suspend"), _job)
JOBSET = Kind("jobset.x-k8s.io", "v1alpha2", "JobSet", "jobsets", ("spec", "suspend"), _jobset)
TRAINJOB = Kind(
    "trainer.kubeflow.org", "v1alpha1", "TrainJob", "trainjobs", ("spec", "suspend"), _none
)
PYTORCHJOB = Kind(
    "kubeflow.org", "v1", "PyTorchJob", "pytorchjobs", ("spec", "runPolicy", "suspend"), _pytorchjob
)
RAYJOB = Kind("ray.io", "v1", "RayJob", "rayjobs", ("spec", "suspend"), _rayjob)
LEADERWORKERSET = Kind(
    "leaderworkerset.x-k8s.io", "v1", "LeaderWorkerSet", "leaderworkersets", None, _leaderworkerset
)

# Held at creation: suspended (or, without a suspend flag, their pods gated).
WORKLOADS = (JOB, JOBSET, TRAINJOB, PYTORCHJOB, RAYJOB, LEADERWORKERSET)
KINDS: dict[tuple[str, str], Kind] = {k.key: k for k in (POD, *WORKLOADS)}

# An object whose controller (ownerReferences) is of one of these kinds is held through its
# owner: it gets Gantry's schedulerName only. The held kinds, and what their controllers
# create in between: a JobSet's Jobs, a TrainJob's JobSet, a RayJob's RayCluster.
OWNED_THROUGH = frozenset(
    {*(k.key for k in WORKLOADS if k.suspend is not None), ("ray.io", "RayCluster")}
)


def find(group: str, kind: str) -> Kind | None:
    return KINDS.get((group, kind))


def group_of(api_version: str) -> str:
    """`apps/v1` -> `apps`; `v1` -> `` (the core group)."""
    return api_version.rpartition("/")[0]
