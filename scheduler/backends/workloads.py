"""The objects users create in Kubernetes that Gantry admits by unsuspending (issue 37).

A mirrored job's spec records its object (`spec["workload"]`: apiVersion, kind, name, ...).
The daemon and the backend name such an object by one string, `<plural>/<name>` ("jobs/ddp",
"jobsets/train"): `PodRequest.workload`, the daemon's suspensions, reconcile's suspends. This
module is the one place that string is made and read, for every kind Gantry resumes; a
pod (single, pod group, or a LeaderWorkerSet's group) is admitted by removing its gate
instead and has none.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Resumable:
    """A kind Gantry resumes (its suspend flag false) and where its API is."""

    group: str
    version: str
    kind: str
    plural: str
    # Where its suspend flag is (a PyTorchJob's is in its run policy).
    suspend: tuple[str, ...] = ("spec", "suspend")

    @property
    def suspend_pointer(self) -> str:
        """The JSON pointer of the suspend flag (`/spec/suspend`)."""
        return "".join(f"/{step}" for step in self.suspend)

    def suspended(self, obj: Mapping[str, Any]) -> bool | None:
        """The object's suspend flag: True, False, or None where it is not set."""
        value: Any = obj
        for step in self.suspend:
            value = value.get(step) if isinstance(value, Mapping) else None
        return value if isinstance(value, bool) else None


JOB = Resumable("batch", "v1", "Job", "jobs")
JOBSET = Resumable("jobset.x-k8s.io", "v1alpha2", "JobSet", "jobsets")
RAYJOB = Resumable("ray.io", "v1", "RayJob", "rayjobs")
TRAINJOB = Resumable("trainer.kubeflow.org", "v1alpha1", "TrainJob", "trainjobs")
PYTORCHJOB = Resumable(
    "kubeflow.org", "v1", "PyTorchJob", "pytorchjobs", ("spec", "runPolicy", "suspend")
)
RESUMABLE = {r.kind: r for r in (JOB, JOBSET, RAYJOB, TRAINJOB, PYTORCHJOB)}
_BY_PLURAL = {r.plural: r for r in RESUMABLE.values()}


def workload_ref(workload: Mapping[str, Any] | None) -> str:
    """`<plural>/<name>` of the object a job's `spec["workload"]` records, when Gantry admits
    it by unsuspending it; "" for any other job (Gantry's own, a pod workload)."""
    if not isinstance(workload, Mapping):
        return ""
    kind = RESUMABLE.get(str(workload.get("kind")))
    return f"{kind.plural}/{workload['name']}" if kind is not None else ""


def parse_ref(ref: str) -> tuple[Resumable, str]:
    """The kind and name `ref` names; ValueError for a string `workload_ref` did not make."""
    plural, _, name = ref.partition("/")
    kind = _BY_PLURAL.get(plural)
    if kind is None or not name:
        raise ValueError(f"not a workload Gantry resumes: {ref!r}")
    return kind, name
