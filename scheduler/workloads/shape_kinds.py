"""What a JobSet, a RayJob, a TrainJob or a PyTorchJob asks for, as one Gantry job (issue
37); the rules a Job's and a pod's shape follow (`shape.py`) apply to each of their pod
templates.

A Gantry job is a gang of replicas alike in GPUs. An object's parts whose pods ask for no GPUs,
beside parts that ask for some (a RayJob's CPU head, a PyTorchJob's CPU Master, a JobSet's
driver), are companions of replica 0 (`scheduler.backends.companions`, the rule the daemon's
admission labels them by): counted in CPU and memory with replica 0, the first pod that asks
for GPUs, at most `MAX_COMPANIONS` of them with the submitter and initializers. The other
parts must ask for the same GPUs: an object whose GPU pods ask for different GPUs is Refused,
saying which, and stays held. CPU and memory per replica are the largest any of its replicas
asks, replica 0's with its companions (a smaller pod holds a little more than it asked, never
less).

- JobSet: each replicated job makes `replicas` Jobs of `parallelism` pods (`completions`, if
  set, must equal `parallelism`: Gantry runs them all at once), from its Job template.
- RayJob: the head (one pod) and each worker group's `replicas` (else `minReplicas`, else 1)
  times `numOfHosts` pods; its submitter (`companions.py`) is counted with replica 0 (the
  head, or the first GPU worker where the head asks for no GPUs).
  It must end its cluster with its job (`spec.shutdownAfterJobFinishes: true`, as Kueue
  requires too): a cluster kept after the job would hold GPUs the queue has taken back.
- TrainJob: `spec.trainer.numNodes` (default 1) pods, each asking
  `spec.trainer.resourcesPerNode`; its image is `spec.trainer.image` (the runtime's node
  template is not read: without them the TrainJob is Refused); the initializers its runtime
  declares (`companions.py`) are counted with its first node.
- PyTorchJob: its Master's `replicas` (one, as its operator requires) and its Worker's
  (default 1 each), from `spec.pytorchReplicaSpecs`; the Master is replica 0, Worker i is
  replica 1 + i (a Master without GPUs beside GPU Workers: Worker i is replica i). A replica
  type other than these two is Refused.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import Any

from scheduler.backends.companions import MAX_COMPANIONS, companion_templates
from scheduler.workloads.companions import Companion, rayjob_companions, trainjob_companions
from scheduler.workloads.kinds import at
from scheduler.workloads.shape import MAX_GROUP, Refused, Shaped, _labels, _payload, pod_resources

Obj = dict[str, Any]
# (what the user calls the pods, how many, their pod spec)
Part = tuple[str, int, Obj]


def _count(value: Any, what: str, default: int = 1) -> int:
    if value is None:
        return default
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise Refused(f"{what} must be a whole number, got {value!r}")
    return value


def _combined(
    name: str,
    obj: Obj,
    parts: Sequence[Part],
    gpu_resource: str,
    spec: Obj,
    beside: Sequence[Companion] = (),
) -> Shaped:
    """One payload for the pods of `parts`: those of the parts asking for GPUs are the
    replicas, alike in GPUs (replica 0 the first of them); the pods of the parts asking for
    none beside them (`scheduler.backends.companions`), and the pods `beside` (no GPUs),
    are counted with replica 0."""
    is_companion = companion_templates([pod for _, _, pod in parts], gpu_resource)
    theirs = [p for p, out in zip(parts, is_companion, strict=True) if out and p[1] > 0]
    _cap([*((what, count) for what, count, _ in theirs), *((what, 1) for what, _ in beside)])
    beside = [*((what, pod) for what, count, pod in theirs for _ in range(count)), *beside]
    parts = [p for p, out in zip(parts, is_companion, strict=True) if not out and p[1] > 0]
    replicas = sum(count for _, count, _ in parts)
    if not 1 <= replicas <= MAX_GROUP:
        raise Refused(f"it makes {replicas} pods; a Gantry job has from 1 to {MAX_GROUP}")
    asked = [(what, pod_resources({"spec": pod}, gpu_resource)) for what, _, pod in parts]
    asked[0] = (asked[0][0], _with_companions(asked[0][1], beside, gpu_resource))
    gpus = {resources[0] for _, resources in asked}
    if len(gpus) > 1:
        each = ", ".join(f"{what} {resources[0]}" for what, resources in asked)
        raise Refused(
            f"its pods ask for different GPUs ({each}): a Gantry job's replicas are alike in "
            "GPUs, so give them the same, or create them as separate objects"
        )
    cpu, memory = (max(r[1] for _, r in asked), max(r[2] for _, r in asked))
    first = {"template": {"spec": parts[0][2]}, **spec}
    return Shaped(_payload(name, _labels(obj), first, replicas, (gpus.pop(), cpu, memory)))


def _cap(beside: Sequence[tuple[str, int]]) -> None:
    """Refuse more pods beside replica 0 (what they are, how many) than MAX_COMPANIONS,
    saying which."""
    total = sum(count for _, count in beside)
    if total <= MAX_COMPANIONS:
        return
    counts: Counter[str] = Counter()
    for what, count in beside:
        counts[what] += count
    each = ", ".join(f"{what} {count}" for what, count in counts.items())
    raise Refused(
        f"it makes {total} pods without GPUs beside its GPU pods ({each}): Gantry runs them "
        f"on its first GPU pod's node, counted with it, and at most {MAX_COMPANIONS}; give "
        "them GPUs as the others, or create them as separate objects"
    )


def _with_companions(
    resources: tuple[int, int, int], beside: Sequence[Companion], gpu_resource: str
) -> tuple[int, int, int]:
    """`resources` (GPUs, milli-CPU, MiB) with the CPU and memory of the pods `beside` added:
    they run on replica 0's node beside it (a CPU head or Master while it runs, a submitter
    while the head runs; initializers before the first node starts, all at once)."""
    gpus, cpu, memory = resources
    for what, pod in beside:
        more_gpus, more_cpu, more_memory = pod_resources({"spec": pod}, gpu_resource)
        if more_gpus:
            raise Refused(
                f"{what} asks for {more_gpus} GPUs: Gantry counts it with the job's first pod, "
                "so it may ask for CPU and memory only"
            )
        cpu, memory = cpu + more_cpu, memory + more_memory
    return gpus, cpu, memory


def shape_jobset(obj: Obj, gpu_resource: str = "nvidia.com/gpu") -> Shaped:
    parts: list[Part] = []
    for index, replicated in enumerate(at(obj, ("spec", "replicatedJobs")) or ()):
        what = f"replicated job {replicated.get('name') or index!r}"
        job = at(replicated, ("template", "spec")) or {}
        parallelism = _count(job.get("parallelism"), f"{what}: parallelism")
        completions = job.get("completions")
        if completions is not None and completions != parallelism:
            raise Refused(
                f"{what} asks for {completions} completions {parallelism} at a time: Gantry "
                "runs a job's pods all at once, so completions must equal parallelism"
            )
        replicas = _count(replicated.get("replicas"), f"{what}: replicas")
        parts.append((what, replicas * parallelism, at(job, ("template", "spec")) or {}))
    if not parts:
        raise Refused("it has no replicated jobs")
    return _combined(_name(obj), obj, parts, gpu_resource, {})


def shape_rayjob(obj: Obj, gpu_resource: str = "nvidia.com/gpu") -> Shaped:
    cluster = at(obj, ("spec", "rayClusterSpec"))
    if not isinstance(cluster, dict):
        raise Refused(
            "it names no spec.rayClusterSpec (a RayJob on an existing cluster is that "
            "cluster's work, not a job of its own)"
        )
    if at(obj, ("spec", "shutdownAfterJobFinishes")) is not True:
        raise Refused(
            "it keeps its Ray cluster after its job finishes (spec.shutdownAfterJobFinishes is "
            "not true): the cluster's pods would hold their GPUs after Gantry has given them "
            "back to the queue, so set spec.shutdownAfterJobFinishes: true"
        )
    parts: list[Part] = [("the head", 1, at(cluster, ("headGroupSpec", "template", "spec")) or {})]
    for group in cluster.get("workerGroupSpecs") or ():
        what = f"worker group {group.get('groupName')!r}"
        count = group.get("replicas", group.get("minReplicas"))
        hosts = _count(group.get("numOfHosts"), f"{what}: numOfHosts")
        replicas = _count(count, f"{what}: replicas") * hosts
        parts.append((what, replicas, at(group, ("template", "spec")) or {}))
    deadline = at(obj, ("spec", "activeDeadlineSeconds"))
    spec = {"activeDeadlineSeconds": deadline}
    return _combined(_name(obj), obj, parts, gpu_resource, spec, rayjob_companions(obj))


def shape_trainjob(
    obj: Obj, gpu_resource: str = "nvidia.com/gpu", runtime: Obj | None = None
) -> Shaped:
    """`runtime`: the training runtime the TrainJob names, when it could be read (its
    initializers are counted); None counts its nodes only."""
    trainer = at(obj, ("spec", "trainer")) or {}
    resources = trainer.get("resourcesPerNode")
    if not isinstance(resources, dict) or not trainer.get("image"):
        raise Refused(
            "Gantry reads what a TrainJob asks for from spec.trainer.image and "
            "spec.trainer.resourcesPerNode (its runtime's template is not read): set both"
        )
    nodes = _count(trainer.get("numNodes"), "spec.trainer.numNodes")
    container = {
        "name": "node",
        "image": trainer["image"],
        "command": trainer.get("command") or [],
        "args": trainer.get("args") or [],
        "resources": resources,
    }
    deadline = at(obj, ("spec", "activeDeadlineSeconds"))
    spec = {"activeDeadlineSeconds": deadline}
    parts: list[Part] = [("node", nodes, {"containers": [container]})]
    return _combined(_name(obj), obj, parts, gpu_resource, spec, trainjob_companions(runtime))


def _name(obj: Obj) -> str:
    return str(at(obj, ("metadata", "name")))


PYTORCH_REPLICA_TYPES = ("Master", "Worker")


def shape_pytorchjob(obj: Obj, gpu_resource: str = "nvidia.com/gpu") -> Shaped:
    specs = at(obj, ("spec", "pytorchReplicaSpecs"))
    if not isinstance(specs, dict) or not specs:
        raise Refused("it has no spec.pytorchReplicaSpecs")
    others = sorted(set(specs) - set(PYTORCH_REPLICA_TYPES))
    if others:
        raise Refused(
            f"its replica types {others} are not Master or Worker, the two a PyTorchJob has"
        )
    parts: list[Part] = []
    for name in PYTORCH_REPLICA_TYPES:
        if name not in specs:
            continue
        replica_spec = specs[name] if isinstance(specs[name], dict) else {}
        count = _count(replica_spec.get("replicas"), f"{name}: replicas")
        if name == "Master" and count != 1:
            raise Refused(f"it asks for {count} Master replicas; a PyTorchJob has one Master")
        parts.append((name, count, at(replica_spec, ("template", "spec")) or {}))
    deadline = at(obj, ("spec", "runPolicy", "activeDeadlineSeconds"))
    return _combined(_name(obj), obj, parts, gpu_resource, {"activeDeadlineSeconds": deadline})
