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
"""

from __future__ import annotations

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
