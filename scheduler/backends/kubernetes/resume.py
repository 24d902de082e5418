"""The JSON patches that admit an object a user created and Gantry holds suspended (issue 37):
Gantry's labels on the pod templates its controller makes pods from, then `spec.suspend`
false, in one patch, per kind (docs/kubernetes-native.md).

The labels go on once, at the first admission, and name no attempt: a template may change
only while the object has never run (a Job's, as the API server guards it), so an object
admitted again after a preemption is only unsuspended. Its controller's pods then carry the
job's label and Gantry's schedulerName, and reconcile adopts each into a replica.

But a RayJob's templates also name the attempt (`gantry.io/attempt`, replaced at each
admission: KubeRay reads them only when it makes a RayCluster, and they may change while the
RayJob is suspended, as Kueue changes them). KubeRay tears a suspended RayJob's cluster down
while its RayCluster controller still makes the cluster's missing pods again, so pods of the
old cluster can outlive the suspension, unbound and not being deleted: named by the attempt
that made them, they are not adopted by the next one (reconcile deletes them as orphans), and
a new attempt takes only the pods of the cluster made for it. So do a TrainJob's initializers
(in Gantry's runtime patch, replaced at each admission): an old attempt's initializer Job may
still make a pod, which no later attempt keeps or binds.

The pods an operator makes beside the replicas (a RayJob's submitter, a TrainJob's
initializers) are labelled too, with `gantry.io/companion`: on the RayJob's submitter template
(with the attempt, as its other templates), and in the TrainJob's runtime patch beside its
`node` job; reconcile binds them to replica 0's node (`scheduler.daemon.companions`). So are
an object's templates whose pods ask for no GPUs beside templates that ask for some (a
RayJob's CPU head, `head`; a PyTorchJob's CPU Master, `master`; a JobSet's driver, its
replicated job's name), by the rule the controller shaped the object with
(`scheduler.backends.companions`): their pods are no replicas, and the replicas are numbered
from the first template that asks for GPUs.

Which replica a pod is, deterministically: a JobSet's templates also carry the first replica
of their replicated job (`gantry.io/replica-base`) and its pods per child Job
(`gantry.io/replica-stride`, the Job's parallelism), so that its pod with job index j and
completion index c is replica `base + j * stride + c` (`status.pod_status`). A PyTorchJob's
templates carry their replica type's first replica (Master 0, Worker 1 after the one
Master), so that its pod of replica index i is replica `base + i`. A RayJob's and a
TrainJob's pods are alike in what they ask for, and adopted in name order.
"""

from __future__ import annotations

from typing import Any

from scheduler.backends.base import PodRequest
from scheduler.backends.companions import companion_templates
from scheduler.backends.kubernetes.render import (
    LABEL_ATTEMPT,
    LABEL_JOB,
    LABEL_JOB_TYPE,
    LABEL_MANAGED,
    _escape,
    label_value,
    workload_admission,
)
from scheduler.backends.workloads import JOB, JOBSET, PYTORCHJOB, RAYJOB, TRAINJOB, Resumable

Obj = dict[str, Any]
Op = dict[str, Any]
Path = tuple[str | int, ...]
LABEL_COMPANION = "gantry.io/companion"
LABEL_REPLICA_BASE = "gantry.io/replica-base"
LABEL_REPLICA_STRIDE = "gantry.io/replica-stride"
# A TrainJob's runtime patch is keyed by its manager; the trainer's own pods are those of
# the runtime's replicated job `node` (the Trainer's name for its training nodes).
TRAINJOB_MANAGER = "gantry.io/scheduler"
TRAINER_NODE_JOB = "node"
# ... and those of its initializers (the Trainer's constants DatasetInitializer and
# ModelInitializer, v2.2.0), which run before the nodes, on no GPU.
TRAINER_INITIALIZER_JOBS = ("dataset-initializer", "model-initializer")
# A RayJob's submitter (its Job's pod) is labelled a companion of replica 0.
SUBMITTER = "submitter"
K8S_JOB_MODE = "K8sJobMode"
# A PyTorchJob's replica types, in the order of their replicas (the operator's own).
PYTORCH_REPLICA_TYPES = ("Master", "Worker")


def resume_patch(
    kind: Resumable, obj: Obj, pod: PodRequest, gpu_resource: str = "nvidia.com/gpu"
) -> list[Op]:
    """The patch that admits `obj` (of `kind`) as the job of `pod` (its replica 0).
    `gpu_resource`: the device resource the controller shaped the object with (its parts
    without it are companions of replica 0, `scheduler.backends.companions`)."""
    if kind == JOB:
        return workload_admission(obj, pod)
    unsuspend = {"op": "replace", "path": kind.suspend_pointer, "value": False}
    if kind == TRAINJOB:
        return [*_trainjob_labels(obj, pod), unsuspend]
    templates = {
        JOBSET: _jobset_templates,
        RAYJOB: _rayjob_templates,
        PYTORCHJOB: _pytorchjob_templates,
    }[kind](obj, gpu_resource)
    labels = _labels(pod) | ({LABEL_ATTEMPT: str(pod.attempt)} if kind == RAYJOB else {})
    ops = [op for path, extra in templates for op in _labelled(obj, path, labels | extra)]
    if kind == RAYJOB:
        ops += _submitter_labels(obj, labels | {LABEL_COMPANION: SUBMITTER})
    return [*ops, unsuspend]


def _labels(pod: PodRequest) -> dict[str, str]:
    return {
        LABEL_MANAGED: "gantry",
        LABEL_JOB: str(pod.job_id),
        LABEL_JOB_TYPE: label_value(pod.job_type) or "unknown",
    }


def _at(obj: Any, path: Path) -> Any:
    for step in path:
        if isinstance(step, int):
            obj = obj[step] if isinstance(obj, list) and step < len(obj) else None
        else:
            obj = obj.get(step) if isinstance(obj, dict) else None
    return obj


def _companions(
    obj: Obj, templates: list[tuple[Path, str]], gpu_resource: str
) -> list[dict[str, str] | None]:
    """For each pod template (its path, and what its pods are called): the companion label
    of a template whose pods go beside replica 0 (they ask for no GPUs where another template
    does), None for a template of replicas."""
    specs = [_at(obj, (*path, "spec")) for path, _ in templates]
    return [
        {LABEL_COMPANION: label_value(name) or "companion"} if out else None
        for (_, name), out in zip(templates, companion_templates(specs, gpu_resource), strict=True)
    ]


def _jobset_templates(obj: Obj, gpu_resource: str) -> list[tuple[Path, dict[str, str]]]:
    """Each replicated job's pod template, with its replicas' base and stride (a replicated
    job without GPUs, a driver, is a companion: no replicas of its own)."""
    jobs = list(_at(obj, ("spec", "replicatedJobs")) or ())
    templates: list[tuple[Path, str]] = [
        (("spec", "replicatedJobs", index, "template", "spec", "template"), _name(job, index))
        for index, job in enumerate(jobs)
    ]
    out: list[tuple[Path, dict[str, str]]] = []
    base = 0
    for replicated, (path, _), companion in zip(
        jobs, templates, _companions(obj, templates, gpu_resource), strict=True
    ):
        if companion is not None:
            out.append((path, companion))
            continue
        stride = _at(replicated, ("template", "spec", "parallelism")) or 1
        out.append((path, {LABEL_REPLICA_BASE: str(base), LABEL_REPLICA_STRIDE: str(stride)}))
        base += (replicated.get("replicas") or 1) * stride
    return out


def _name(replicated: Any, index: int) -> str:
    name = replicated.get("name") if isinstance(replicated, dict) else None
    return str(name or index)


def _pytorchjob_templates(obj: Obj, gpu_resource: str) -> list[tuple[Path, dict[str, str]]]:
    """Each replica type's pod template (Master, then Worker), with its first replica (a
    Master without GPUs beside GPU Workers is a companion: Worker i is then replica i)."""
    types = [
        name
        for name in PYTORCH_REPLICA_TYPES
        if isinstance(_at(obj, ("spec", "pytorchReplicaSpecs", name)), dict)
    ]
    templates: list[tuple[Path, str]] = [
        # named as the operator names the replica type on its pods (master)
        (("spec", "pytorchReplicaSpecs", name, "template"), name.lower())
        for name in types
    ]
    out: list[tuple[Path, dict[str, str]]] = []
    base = 0
    for name, (path, _), companion in zip(
        types, templates, _companions(obj, templates, gpu_resource), strict=True
    ):
        if companion is not None:
            out.append((path, companion))
            continue
        out.append((path, {LABEL_REPLICA_BASE: str(base)}))
        replicas = _at(obj, ("spec", "pytorchReplicaSpecs", name, "replicas"))
        base += replicas if isinstance(replicas, int) else 1
    return out


def _rayjob_templates(obj: Obj, gpu_resource: str) -> list[tuple[Path, dict[str, str]]]:
    """The head's and each worker group's pod template (the head without GPUs beside GPU
    workers, as nearly every RayJob has it, is a companion: the first worker is replica 0)."""
    cluster = ("spec", "rayClusterSpec")
    workers = _at(obj, (*cluster, "workerGroupSpecs")) or ()
    templates: list[tuple[Path, str]] = [
        ((*cluster, "headGroupSpec", "template"), "head"),
        *(
            ((*cluster, "workerGroupSpecs", i, "template"), f"worker-group-{_group(group, i)}")
            for i, group in enumerate(workers)
        ),
    ]
    return [
        (path, companion or {})
        for (path, _), companion in zip(
            templates, _companions(obj, templates, gpu_resource), strict=True
        )
    ]


def _group(group: Any, index: int) -> str:
    name = group.get("groupName") if isinstance(group, dict) else None
    return str(name or index)


def _submitter_labels(obj: Obj, labels: dict[str, str]) -> list[Op]:
    """The labels on a RayJob's submitter template (K8sJobMode, KubeRay's default mode: the
    pod of the Job KubeRay makes to run `ray job submit`), so that Gantry binds that pod
    where it reserved its room, beside replica 0 (`scheduler.daemon.companions`). The webhook
    wrote KubeRay's default template where the user gave none (`mutate.plan`); a RayJob
    without one (created before it did) is left as it is: a template of labels alone would
    replace KubeRay's default and leave the submitter without a container."""
    if (_at(obj, ("spec", "submissionMode")) or K8S_JOB_MODE) != K8S_JOB_MODE:
        return []
    path = ("spec", "submitterPodTemplate")
    if not isinstance(_at(obj, (*path, "spec")), dict):
        return []
    return _labelled(obj, path, labels)


def _labelled(obj: Obj, template: Path, labels: dict[str, str]) -> list[Op]:
    """The ops that put `labels` on the pod template at `template` (nothing already there)."""
    here = _at(obj, template)
    pointer = "".join(f"/{_escape(str(step))}" for step in template)
    if not isinstance(here, dict):
        return [{"op": "add", "path": pointer, "value": {"metadata": {"labels": labels}}}]
    if not isinstance(here.get("metadata"), dict):
        return [{"op": "add", "path": f"{pointer}/metadata", "value": {"labels": labels}}]
    have = here["metadata"].get("labels")
    if not isinstance(have, dict):
        return [{"op": "add", "path": f"{pointer}/metadata/labels", "value": labels}]
    return [
        {"op": "add", "path": f"{pointer}/metadata/labels/{_escape(key)}", "value": value}
        for key, value in labels.items()
        if have.get(key) != value
    ]


def _trainjob_labels(obj: Obj, pod: PodRequest) -> list[Op]:
    """Gantry's runtime patch (its own, by manager): the labels on the pods of the runtime's
    trainer nodes, and on its initializers' with the attempt. The Trainer applies it to the
    JobSet it makes for the TrainJob. Written at the first admission; at each later one only
    the initializers' attempt is replaced (the nodes' labels name none, as a Job's)."""
    patches = _at(obj, ("spec", "runtimePatches"))
    ours = [
        i
        for i, p in enumerate(patches if isinstance(patches, list) else ())
        if isinstance(p, dict) and p.get("manager") == TRAINJOB_MANAGER
    ]
    if ours:
        return _initializers_attempt(obj, ours[0], pod.attempt)
    template = {"metadata": {"labels": _labels(pod)}}
    node = {"name": TRAINER_NODE_JOB, "template": {"spec": {"template": template}}}
    # The initializers' pods, companions of the first node (the Trainer merges a job's patch
    # into the runtime's replicated job of that name, and skips a name the runtime lacks),
    # named by the attempt: an older attempt's initializer Job, not yet torn down, makes pods
    # that no later attempt keeps or binds.
    attempt = {LABEL_ATTEMPT: str(pod.attempt)}
    initializers = [
        {
            "name": name,
            "template": {
                "spec": {
                    "template": {
                        "metadata": {"labels": _labels(pod) | {LABEL_COMPANION: name} | attempt}
                    }
                }
            },
        }
        for name in TRAINER_INITIALIZER_JOBS
    ]
    patch = {
        "manager": TRAINJOB_MANAGER,
        "trainingRuntimeSpec": {"template": {"spec": {"replicatedJobs": [node, *initializers]}}},
    }
    if not isinstance(patches, list):
        return [{"op": "add", "path": "/spec/runtimePatches", "value": [patch]}]
    return [{"op": "add", "path": "/spec/runtimePatches/-", "value": patch}]


def _initializers_attempt(obj: Obj, index: int, attempt: int) -> list[Op]:
    """The ops that name `attempt` on the initializers' templates of Gantry's runtime patch
    (at `spec.runtimePatches[index]`), nothing where they name it already."""
    jobs: Path = ("spec", "runtimePatches", index, "trainingRuntimeSpec", "template", "spec")
    ops: list[Op] = []
    for j, job in enumerate(_at(obj, (*jobs, "replicatedJobs")) or ()):
        if isinstance(job, dict) and job.get("name") in TRAINER_INITIALIZER_JOBS:
            path = (*jobs, "replicatedJobs", j, "template", "spec", "template")
            ops += _labelled(obj, path, {LABEL_ATTEMPT: str(attempt)})
    return ops
