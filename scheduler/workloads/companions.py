"""The pods a RayJob or a TrainJob makes beside its replicas (issue 37), as Kueue counts them.

A RayJob in `submissionMode: K8sJobMode` (KubeRay's default when the mode is not set) runs
`ray job submit` from a pod of its own, the submitter: a Job KubeRay makes once the cluster is
up, from `spec.submitterPodTemplate` or, without one, from KubeRay's default template (one
container, `DEFAULT_SUBMITTER` below: the requests of KubeRay v1.6.0's
`GetDefaultSubmitterContainer`). In `SidecarMode` the same container runs inside the head pod.
`HTTPMode` and `InteractiveMode` make no pod: the operator, or the user, submits.

A TrainJob's runtime (its `runtimeRef`: a ClusterTrainingRuntime, or a TrainingRuntime in the
TrainJob's namespace) may declare initializers beside its training nodes: the replicated jobs
`dataset-initializer` and `model-initializer` of the runtime's JobSet template, each
`replicas` x `parallelism` pods (one each, as the Trainer's runtimes declare them), which run
before the nodes start (`dependsOn`) and then end.

Kueue counts each as a pod set of the workload. A Gantry job is a gang of replicas alike, so
these pods are counted with replica 0 (the head; a TrainJob's first node): their CPU and memory
are added to its own, and every replica of the job then reserves that much (a little more than
the others asked, never less). They ask for no GPUs: one that does is Refused, saying which.
Gantry binds their pods to replica 0's node (`scheduler.daemon.companions`).
"""

from __future__ import annotations

import copy
from typing import Any

from scheduler.workloads.kinds import at

Obj = dict[str, Any]
# (what the user calls it, its pod spec)
Companion = tuple[str, Obj]

K8S_JOB_MODE = "K8sJobMode"
SIDECAR_MODE = "SidecarMode"
DEFAULT_SUBMITTER: Obj = {
    "restartPolicy": "Never",
    "containers": [
        {
            "name": "ray-job-submitter",
            "resources": {
                "requests": {"cpu": "500m", "memory": "200Mi"},
                "limits": {"cpu": "1", "memory": "1Gi"},
            },
        }
    ],
}
INITIALIZERS = ("dataset-initializer", "model-initializer")
CLUSTER_RUNTIME = "ClusterTrainingRuntime"
RUNTIME = "TrainingRuntime"


def rayjob_companions(obj: Obj) -> list[Companion]:
    """The submitter of a RayJob, in the modes that make one; none in the others."""
    mode = at(obj, ("spec", "submissionMode")) or K8S_JOB_MODE
    if mode == K8S_JOB_MODE:
        template = at(obj, ("spec", "submitterPodTemplate", "spec"))
        return [("its submitter", template if isinstance(template, dict) else DEFAULT_SUBMITTER)]
    if mode == SIDECAR_MODE:
        return [("its submitter", DEFAULT_SUBMITTER)]
    return []


def default_submitter_template(obj: Obj, scheduler_name: str) -> Obj | None:
    """KubeRay's default submitter template (v1.6.0's `GetDefaultSubmitterTemplate`: one
    container, `DEFAULT_SUBMITTER`, in the head's image), for a RayJob in K8sJobMode that
    gives none; None for any other (a template of its own, another mode, a head without an
    image: KubeRay's own validation refuses that one).

    The webhook writes it at creation, as Kueue writes it when it admits a RayJob, so that
    Gantry's admission only labels the template the submitter pod is made from (the job, the
    attempt, `gantry.io/companion`) and binds that pod beside replica 0: KubeRay makes the
    same pod from it as from its default (it fills the command and the environment in both)."""
    mode = at(obj, ("spec", "submissionMode")) or K8S_JOB_MODE
    if mode != K8S_JOB_MODE or at(obj, ("spec", "submitterPodTemplate")) is not None:
        return None
    head = at(obj, ("spec", "rayClusterSpec", "headGroupSpec", "template", "spec"))
    image = at(head, ("containers", 0, "image"))
    if not isinstance(image, str) or not image:
        return None
    spec = copy.deepcopy(DEFAULT_SUBMITTER)
    spec["containers"][0]["image"] = image
    return {"spec": {**spec, "schedulerName": scheduler_name}}


def runtime_ref(obj: Obj) -> tuple[str, str] | None:
    """(kind, name) of the runtime a TrainJob names (kind ClusterTrainingRuntime unless it
    says TrainingRuntime); None when it names none."""
    ref = at(obj, ("spec", "runtimeRef"))
    if not isinstance(ref, dict) or not ref.get("name"):
        return None
    kind = RUNTIME if ref.get("kind") == RUNTIME else CLUSTER_RUNTIME
    return kind, str(ref["name"])


def trainjob_companions(runtime: Obj | None) -> list[Companion]:
    """The initializer pods a TrainJob's runtime declares (none without a runtime)."""
    out: list[Companion] = []
    for replicated in at(runtime, ("spec", "template", "spec", "replicatedJobs")) or ():
        name = replicated.get("name") if isinstance(replicated, dict) else None
        if name not in INITIALIZERS:
            continue
        job = at(replicated, ("template", "spec")) or {}
        replicas = replicated.get("replicas")
        parallelism = job.get("parallelism")
        count = (replicas if isinstance(replicas, int) else 1) * (
            parallelism if isinstance(parallelism, int) else 1
        )
        pod = at(job, ("template", "spec")) or {}
        out += [(f"its {name}", pod)] * max(0, count)
    return out
