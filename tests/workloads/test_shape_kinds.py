"""What a JobSet, RayJob or TrainJob asks for as one Gantry job
(scheduler/workloads/shape_kinds.py), the pods beside its replicas included
(scheduler/workloads/companions.py), and the patch that admits it
(scheduler/backends/kubernetes/resume.py): pure, no server."""

from __future__ import annotations

import re
from typing import Any

import jsonpatch
import pytest

from scheduler.backends.kubernetes.resume import (
    LABEL_REPLICA_BASE,
    LABEL_REPLICA_STRIDE,
    resume_patch,
)
from scheduler.backends.kubernetes.status import pod_status
from scheduler.backends.workloads import (
    JOBSET,
    PYTORCHJOB,
    RAYJOB,
    TRAINJOB,
    parse_ref,
    workload_ref,
)
from scheduler.workloads.companions import runtime_ref
from scheduler.workloads.shape import Refused
from scheduler.workloads.shape_kinds import (
    shape_jobset,
    shape_pytorchjob,
    shape_rayjob,
    shape_trainjob,
)
from tests.k8s.builders import make_request
from tests.scheduler.core.builders import cycle, make_job, make_node, placed_nodes, snapshot
from tests.workloads.test_kinds_queued import RAY_ENDS

Obj = dict[str, Any]


def pod(gpus: int, cpu: str = "2", memory: str = "8Gi") -> Obj:
    resources = {
        "limits": {"nvidia.com/gpu": str(gpus)},
        "requests": {"cpu": cpu, "memory": memory},
    }
    return {
        "containers": [
            {"name": "main", "image": "registry.example.com/a:1", "resources": resources}
        ]
    }


def replicated(
    name: str, replicas: int | None, parallelism: int | None, spec: Obj, **job: Any
) -> Obj:
    template: Obj = {"template": {"spec": spec}, **job}
    if parallelism is not None:
        template["parallelism"] = parallelism
    out: Obj = {"name": name, "template": {"spec": template}}
    if replicas is not None:
        out["replicas"] = replicas
    return out


def jobset(*jobs: Obj) -> Obj:
    return {"metadata": {"name": "js"}, "spec": {"suspend": True, "replicatedJobs": list(jobs)}}


@pytest.mark.parametrize(
    ("jobs", "replicas", "per_replica"),
    [
        # 2 Jobs x 4 pods = 8 replicas of 8 GPUs
        pytest.param(
            [replicated("w", 2, 4, pod(8))], 8, (8, 2000, 8192), id="replicas-x-parallelism"
        ),
        # defaults: 1 Job of 1 pod
        pytest.param([replicated("w", None, None, pod(1))], 1, (1, 2000, 8192), id="defaults"),
        # 1 + 3 = 4 replicas; CPU and memory the larger of the two templates'
        pytest.param(
            [replicated("a", 1, 1, pod(4, "8", "8Gi")), replicated("b", 3, 1, pod(4, "2", "64Gi"))],
            4,
            (4, 8000, 65536),
            id="largest-cpu-and-memory",
        ),
    ],
)
def test_a_jobset_is_its_pods(
    jobs: list[Obj], replicas: int, per_replica: tuple[int, int, int]
) -> None:
    payload = shape_jobset(jobset(*jobs)).payload
    resources = payload["resources"]
    assert payload["replicas"] == replicas
    assert (resources["gpus"], resources["cpu_milli"], resources["memory_mib"]) == per_replica


@pytest.mark.parametrize(
    ("obj", "why"),
    [
        (
            jobset(replicated("w", 1, 2, pod(8), completions=4)),
            "completions must equal parallelism",
        ),
        (
            jobset(replicated("a", 1, 1, pod(8)), replicated("b", 1, 1, pod(4))),
            "'a' 8, replicated job 'b' 4",
        ),
        (jobset(), "no replicated jobs"),
        (jobset(replicated("w", 2000, 1, pod(1))), "a Gantry job has from 1 to 1024"),
        (jobset(replicated("w", "2", 1, pod(1))), "replicas must be a whole number"),
    ],
    ids=["work-queue", "uneven-gpus", "empty", "too-many", "not-a-number"],
)
def test_what_a_jobset_cannot_be_is_refused(obj: Obj, why: str) -> None:
    with pytest.raises(Refused, match=why):
        shape_jobset(obj)


def test_a_rayjob_is_its_head_and_workers() -> None:
    # 1 head + 2 x 2 hosts (replicas) + 3 (minReplicas, no replicas) = 8 pods
    groups = [
        {"groupName": "a", "replicas": 2, "numOfHosts": 2, "template": {"spec": pod(8)}},
        {"groupName": "b", "minReplicas": 3, "template": {"spec": pod(8)}},
    ]
    cluster = {"headGroupSpec": {"template": {"spec": pod(8)}}, "workerGroupSpecs": groups}
    obj = {
        "metadata": {"name": "r"},
        "spec": {"rayClusterSpec": cluster, "activeDeadlineSeconds": 600, **RAY_ENDS},
    }
    payload = shape_rayjob(obj).payload
    assert (payload["replicas"], payload["resources"]["gpus"], payload["max_runtime_s"]) == (
        8,
        8,
        600,
    )


def test_a_rayjob_without_its_cluster_is_refused() -> None:
    with pytest.raises(Refused, match="rayClusterSpec"):
        shape_rayjob({"metadata": {"name": "r"}, "spec": {"clusterSelector": {"a": "b"}}})


def test_a_trainjob_is_its_nodes() -> None:
    trainer = {
        "numNodes": 4,
        "image": "registry.example.com/t:1",
        "command": ["torchrun"],
        "resourcesPerNode": {"limits": {"nvidia.com/gpu": "8"}},
    }
    payload = shape_trainjob({"metadata": {"name": "t"}, "spec": {"trainer": trainer}}).payload
    assert (payload["replicas"], payload["resources"]["gpus"], payload["image"]) == (
        4,
        8,
        "registry.example.com/t:1",
    )
    assert payload["command"] == ["torchrun"]


def test_the_ref_names_each_resumed_kind_and_nothing_else() -> None:
    assert workload_ref({"kind": "JobSet", "name": "a"}) == "jobsets/a"
    assert workload_ref({"kind": "Job", "name": "a"}) == "jobs/a"
    assert workload_ref({"kind": "Pod", "name": "a"}) == ""
    assert workload_ref({"kind": "LeaderWorkerSet", "name": "a"}) == ""
    assert workload_ref(None) == ""
    assert parse_ref("rayjobs/x") == (RAYJOB, "x")
    with pytest.raises(ValueError, match="not a workload"):
        parse_ref("pods/x")


def test_a_jobsets_admission_labels_each_template_with_its_replicas_base_and_stride() -> None:
    """Replicated job a: 2 Jobs x 3 pods (replicas 0-5); b: 1 x 2 (6-7)."""
    obj = jobset(replicated("a", 2, 3, pod(1)), replicated("b", 1, 2, pod(1)))
    request = make_request(job_id=7)
    patched = jsonpatch.apply_patch(obj, resume_patch(JOBSET, obj, request))
    labels = [
        r["template"]["spec"]["template"]["metadata"]["labels"]
        for r in patched["spec"]["replicatedJobs"]
    ]
    assert [(x[LABEL_REPLICA_BASE], x[LABEL_REPLICA_STRIDE]) for x in labels] == [
        ("0", "3"),
        ("6", "2"),
    ]
    assert {x["gantry.io/job-id"] for x in labels} == {"7"}
    assert patched["spec"]["suspend"] is False
    # Admitted again: only unsuspended (its templates are labelled already).
    assert resume_patch(JOBSET, patched, request) == [
        {"op": "replace", "path": "/spec/suspend", "value": False}
    ]


def test_a_trainjobs_admission_adds_one_runtime_patch_of_gantrys_own() -> None:
    obj: Obj = {
        "spec": {"suspend": True, "runtimePatches": [{"manager": "kueue.x-k8s.io/manager"}]}
    }
    request = make_request(job_id=3)
    patched = jsonpatch.apply_patch(obj, resume_patch(TRAINJOB, obj, request))
    managers = [p["manager"] for p in patched["spec"]["runtimePatches"]]
    assert managers == ["kueue.x-k8s.io/manager", "gantry.io/scheduler"]
    jobs = patched["spec"]["runtimePatches"][1]["trainingRuntimeSpec"]["template"]["spec"][
        "replicatedJobs"
    ]
    labels = {j["name"]: j["template"]["spec"]["template"]["metadata"]["labels"] for j in jobs}
    # the trainer's nodes, and its initializers as companions of the first node
    assert list(labels) == ["node", "dataset-initializer", "model-initializer"]
    assert {x["gantry.io/job-id"] for x in labels.values()} == {"3"}
    assert "gantry.io/companion" not in labels["node"]
    assert labels["model-initializer"]["gantry.io/companion"] == "model-initializer"
    again = resume_patch(TRAINJOB, patched, request)
    assert again == [{"op": "replace", "path": "/spec/suspend", "value": False}]
    # admitted again under attempt 1: only the initializers' attempt is replaced
    assert labels["dataset-initializer"]["gantry.io/attempt"] == "0"
    assert "gantry.io/attempt" not in labels["node"]
    patched["spec"]["suspend"] = True
    later = resume_patch(TRAINJOB, patched, make_request(job_id=3, attempt=1))
    jobs_at = "/spec/runtimePatches/1/trainingRuntimeSpec/template/spec/replicatedJobs"
    assert sorted(op["path"] for op in later if op["path"] != "/spec/suspend") == [
        f"{jobs_at}/{j}/template/spec/template/metadata/labels/gantry.io~1attempt" for j in (1, 2)
    ]
    assert {op["value"] for op in later} == {"1", False}


def rayjob_with(head: Obj, worker: Obj, **spec: Any) -> Obj:
    groups = [{"groupName": "gpu", "replicas": 1, "template": {"spec": worker}}]
    cluster = {"headGroupSpec": {"template": {"spec": head}}, "workerGroupSpecs": groups}
    return {"metadata": {"name": "r"}, "spec": {"rayClusterSpec": cluster, **RAY_ENDS, **spec}}


def per_replica(payload: Obj) -> tuple[int, int, int, int]:
    resources = payload["resources"]
    return (
        payload["replicas"],
        resources["gpus"],
        resources["cpu_milli"],
        resources["memory_mib"],
    )


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        # KubeRay's default submitter (500m, 200Mi) beside the head (2 CPU, 8 GiB):
        # 2000 + 500 = 2500 mCPU, 8192 + 200 = 8392 MiB, the larger of head and worker
        pytest.param({}, (2, 8, 2500, 8392), id="k8s-job-mode-by-default"),
        pytest.param(
            {"submissionMode": "K8sJobMode"}, (2, 8, 2500, 8392), id="k8s-job-mode-default-pod"
        ),
        # the user's submitter template: 2000 + 1000 mCPU, 8192 + 1024 MiB
        pytest.param(
            {"submitterPodTemplate": {"spec": pod(0, "1", "1Gi")}},
            (2, 8, 3000, 9216),
            id="users-submitter-template",
        ),
        # the same container, in the head pod
        pytest.param({"submissionMode": "SidecarMode"}, (2, 8, 2500, 8392), id="sidecar"),
        # no submitter pod: the head and the worker alone
        pytest.param({"submissionMode": "HTTPMode"}, (2, 8, 2000, 8192), id="http-mode"),
        pytest.param(
            {"submissionMode": "InteractiveMode"}, (2, 8, 2000, 8192), id="interactive-mode"
        ),
    ],
)
def test_a_rayjobs_submitter_counts_with_its_head(
    spec: Obj, expected: tuple[int, int, int, int]
) -> None:
    assert per_replica(shape_rayjob(rayjob_with(pod(8), pod(8), **spec)).payload) == expected


def test_a_worker_larger_than_the_head_and_its_submitter_sets_the_replicas_size() -> None:
    # head 2000 + 500 mCPU < worker 4000; memory 8192 + 200 > 8192
    shaped = shape_rayjob(rayjob_with(pod(8), pod(8, "4", "8Gi"))).payload
    assert per_replica(shaped) == (2, 8, 4000, 8392)


def test_a_submitter_asking_for_gpus_is_refused_saying_so() -> None:
    obj = rayjob_with(pod(8), pod(8), submitterPodTemplate={"spec": pod(1)})
    with pytest.raises(Refused, match="its submitter asks for 1 GPUs"):
        shape_rayjob(obj)


def runtime(*jobs: Obj) -> Obj:
    return {
        "kind": "ClusterTrainingRuntime",
        "metadata": {"name": "torch"},
        "spec": {"template": {"spec": {"replicatedJobs": list(jobs)}}},
    }


def trainjob_of(cpu: str, memory: str) -> Obj:
    resources = {"limits": {"nvidia.com/gpu": "8"}, "requests": {"cpu": cpu, "memory": memory}}
    trainer = {"numNodes": 2, "image": "registry.example.com/t:1", "resourcesPerNode": resources}
    return {
        "metadata": {"name": "t"},
        "spec": {"runtimeRef": {"name": "torch"}, "trainer": trainer},
    }


@pytest.mark.parametrize(
    ("declared", "expected"),
    [
        # both initializers (2 CPU, 4 GiB each) beside the first node (4 CPU, 16 GiB):
        # 4000 + 2 x 2000 mCPU, 16384 + 2 x 4096 MiB
        pytest.param(
            runtime(
                replicated("dataset-initializer", 1, None, pod(0, "2", "4Gi")),
                replicated("model-initializer", 1, None, pod(0, "2", "4Gi")),
                replicated("node", 1, None, pod(8, "1", "1Gi")),
            ),
            (2, 8, 8000, 24576),
            id="both-initializers",
        ),
        pytest.param(
            runtime(replicated("model-initializer", None, None, pod(0, "500m", "1Gi"))),
            (2, 8, 4500, 17408),
            id="one-initializer",
        ),
        # the runtime's node job is the trainer's own (spec.trainer), not an initializer
        pytest.param(
            runtime(replicated("node", 1, None, pod(8, "64", "1Gi"))),
            (2, 8, 4000, 16384),
            id="no-initializers",
        ),
        pytest.param(None, (2, 8, 4000, 16384), id="runtime-not-read"),
    ],
)
def test_a_trainjobs_initializers_count_with_its_first_node(
    declared: Obj | None, expected: tuple[int, int, int, int]
) -> None:
    shaped = shape_trainjob(trainjob_of("4", "16Gi"), runtime=declared)
    assert per_replica(shaped.payload) == expected


def test_an_initializer_asking_for_gpus_is_refused_saying_so() -> None:
    declared = runtime(replicated("model-initializer", 1, None, pod(1)))
    with pytest.raises(Refused, match="its model-initializer asks for 1 GPUs"):
        shape_trainjob(trainjob_of("4", "16Gi"), runtime=declared)


@pytest.mark.parametrize(
    ("ref", "expected"),
    [
        ({"name": "torch"}, ("ClusterTrainingRuntime", "torch")),
        ({"name": "torch", "kind": "TrainingRuntime"}, ("TrainingRuntime", "torch")),
        ({"kind": "TrainingRuntime"}, None),
        (None, None),
    ],
    ids=["cluster-by-default", "namespaced", "no-name", "none"],
)
def test_a_trainjob_names_its_runtime(ref: Obj | None, expected: tuple[str, str] | None) -> None:
    assert runtime_ref({"spec": {"runtimeRef": ref}}) == expected


def test_a_rayjobs_admission_names_the_attempt_on_its_templates_each_time() -> None:
    """Attempt 0 labels the head and worker templates; attempt 1 replaces the attempt only
    (KubeRay's pods of the cluster made for attempt 0 are then not attempt 1's)."""
    obj = rayjob_with(pod(8), pod(8), suspend=True)
    first = jsonpatch.apply_patch(obj, resume_patch(RAYJOB, obj, make_request(job_id=5)))
    cluster = first["spec"]["rayClusterSpec"]
    templates = [cluster["headGroupSpec"]["template"], cluster["workerGroupSpecs"][0]["template"]]
    assert [t["metadata"]["labels"]["gantry.io/attempt"] for t in templates] == ["0", "0"]
    first["spec"]["suspend"] = True
    again = resume_patch(RAYJOB, first, make_request(job_id=5, attempt=1))
    changed = sorted(op["path"] for op in again)
    assert changed == [
        "/spec/rayClusterSpec/headGroupSpec/template/metadata/labels/gantry.io~1attempt",
        "/spec/rayClusterSpec/workerGroupSpecs/0/template/metadata/labels/gantry.io~1attempt",
        "/spec/suspend",
    ]
    assert {op["value"] for op in again if op["path"] != "/spec/suspend"} == {"1"}


# -- parts without GPUs beside parts with GPUs: companions of replica 0 ----------------------


def pytorchjob_with(master: Obj, worker: Obj, workers: int) -> Obj:
    specs = {
        "Master": {"replicas": 1, "template": {"spec": master}},
        "Worker": {"replicas": workers, "template": {"spec": worker}},
    }
    return {"metadata": {"name": "pt"}, "spec": {"pytorchReplicaSpecs": specs}}


def rayjob_of(head: Obj, *groups: tuple[str, int, Obj], **spec: Any) -> Obj:
    workers = [
        {"groupName": name, "replicas": count, "template": {"spec": worker}}
        for name, count, worker in groups
    ]
    cluster = {"headGroupSpec": {"template": {"spec": head}}, "workerGroupSpecs": workers}
    return {"metadata": {"name": "r"}, "spec": {"rayClusterSpec": cluster, **RAY_ENDS, **spec}}


@pytest.mark.parametrize(
    ("shape", "obj", "expected"),
    [
        # a CPU head (4 CPU, 16 GiB) and KubeRay's default submitter (500m, 200Mi) beside the
        # first of 2 GPU workers (2 CPU, 8 GiB): 2000 + 4000 + 500 mCPU, 8192 + 16384 + 200 MiB
        pytest.param(
            shape_rayjob,
            rayjob_of(pod(0, "4", "16Gi"), ("gpu", 2, pod(8))),
            (2, 8, 6500, 24776),
            id="rayjob-cpu-head",
        ),
        # the same head in HTTPMode (no submitter pod): 2000 + 4000, 8192 + 16384
        pytest.param(
            shape_rayjob,
            rayjob_of(pod(0, "4", "16Gi"), ("gpu", 2, pod(8)), submissionMode="HTTPMode"),
            (2, 8, 6000, 24576),
            id="rayjob-cpu-head-http-mode",
        ),
        # a CPU worker group (2 x 1 CPU, 1 GiB) beside a GPU head: with the head, replica 0,
        # and the GPU group: 2000 + 2 x 1000 + 500 mCPU, 8192 + 2 x 1024 + 200 MiB
        pytest.param(
            shape_rayjob,
            rayjob_of(pod(8), ("cpu", 2, pod(0, "1", "1Gi")), ("gpu", 1, pod(8))),
            (2, 8, 4500, 10440),
            id="rayjob-cpu-workers",
        ),
        # a CPU Master (1 CPU, 2 GiB) beside 3 GPU Workers: 2000 + 1000, 8192 + 2048
        pytest.param(
            shape_pytorchjob,
            pytorchjob_with(pod(0, "1", "2Gi"), pod(8), 3),
            (3, 8, 3000, 10240),
            id="pytorchjob-cpu-master",
        ),
        # a driver replicated job (1 x 1 pod of 1 CPU, 1 GiB) beside 2 Jobs x 2 GPU pods
        pytest.param(
            shape_jobset,
            jobset(replicated("driver", 1, 1, pod(0, "1", "1Gi")), replicated("w", 2, 2, pod(8))),
            (4, 8, 3000, 9216),
            id="jobset-driver",
        ),
        # no part asks for GPUs: alike at none, every pod a replica (as before)
        pytest.param(
            shape_jobset,
            jobset(replicated("a", 1, 1, pod(0)), replicated("b", 1, 2, pod(0, "4"))),
            (3, 0, 4000, 8192),
            id="no-gpus-anywhere",
        ),
    ],
)
def test_parts_without_gpus_beside_gpu_parts_count_with_replica_0(
    shape: Any, obj: Obj, expected: tuple[int, int, int, int]
) -> None:
    assert per_replica(shape(obj).payload) == expected


@pytest.mark.parametrize(
    ("obj", "why"),
    [
        # 9 driver pods beside the GPU pods
        (
            jobset(replicated("driver", 3, 3, pod(0)), replicated("w", 1, 1, pod(8))),
            "it makes 9 pods without GPUs beside its GPU pods (replicated job 'driver' 9)",
        ),
        # the worker group scaled to none: the CPU head alone beside nothing
        (
            jobset(replicated("driver", 1, 1, pod(0)), replicated("w", 0, 1, pod(8))),
            "it makes 0 pods",
        ),
    ],
    ids=["over-the-cap", "no-gpu-pod-left"],
)
def test_what_cannot_go_beside_replica_0_is_refused(obj: Obj, why: str) -> None:
    with pytest.raises(Refused, match=re.escape(why)):
        shape_jobset(obj)


def test_a_rayjob_over_the_cap_counts_its_submitter() -> None:
    # 7 CPU workers, the CPU head and KubeRay's default submitter: 9 > 8
    obj = rayjob_of(pod(0), ("cpu", 7, pod(0)), ("gpu", 1, pod(8)))
    with pytest.raises(Refused, match=r"9 pods without GPUs .*the head 1, worker group 'cpu' 7"):
        shape_rayjob(obj)
    obj["spec"]["submissionMode"] = "HTTPMode"  # 8: at the cap
    assert per_replica(shape_rayjob(obj).payload)[:2] == (1, 8)


def labels_at(obj: Obj, *path: str | int) -> dict[str, str]:
    here: Any = obj
    for step in path:
        here = here[step]
    found: dict[str, str] = here["metadata"]["labels"]
    return found


def test_a_rayjobs_cpu_head_is_labelled_a_companion_at_each_admission() -> None:
    """The head's template gets `gantry.io/companion: head` with the attempt; the GPU
    workers' none (they are the replicas)."""
    obj = rayjob_of(pod(0), ("gpu", 2, pod(8)), suspend=True)
    first = jsonpatch.apply_patch(obj, resume_patch(RAYJOB, obj, make_request(job_id=5)))
    cluster = ("spec", "rayClusterSpec")
    head = labels_at(first, *cluster, "headGroupSpec", "template")
    worker = labels_at(first, *cluster, "workerGroupSpecs", 0, "template")
    assert (head["gantry.io/companion"], head["gantry.io/attempt"]) == ("head", "0")
    assert "gantry.io/companion" not in worker and worker["gantry.io/attempt"] == "0"
    first["spec"]["suspend"] = True
    again = jsonpatch.apply_patch(
        first, resume_patch(RAYJOB, first, make_request(job_id=5, attempt=1))
    )
    assert labels_at(again, *cluster, "headGroupSpec", "template")["gantry.io/attempt"] == "1"
    # A GPU head is a replica as before: no companion label on any template.
    gpu_head = rayjob_of(pod(8), ("gpu", 1, pod(8)), suspend=True)
    ops = resume_patch(RAYJOB, gpu_head, make_request(job_id=5))
    assert not [op for op in ops if "gantry.io/companion" in str(op)]


def test_a_jobsets_driver_is_a_companion_and_its_gpu_jobs_number_the_replicas_from_0() -> None:
    obj = jobset(replicated("driver", 1, 1, pod(0)), replicated("w", 2, 3, pod(8)))
    patched = jsonpatch.apply_patch(obj, resume_patch(JOBSET, obj, make_request(job_id=7)))
    driver, workers = (
        labels_at(r, "template", "spec", "template") for r in patched["spec"]["replicatedJobs"]
    )
    assert driver["gantry.io/companion"] == "driver" and LABEL_REPLICA_BASE not in driver
    assert (workers[LABEL_REPLICA_BASE], workers[LABEL_REPLICA_STRIDE]) == ("0", "3")
    assert "gantry.io/companion" not in workers


def test_a_pytorchjobs_cpu_master_is_a_companion_and_worker_i_is_replica_i() -> None:
    obj = pytorchjob_with(pod(0), pod(8), 2)
    obj["spec"]["runPolicy"] = {"suspend": True}
    patched = jsonpatch.apply_patch(obj, resume_patch(PYTORCHJOB, obj, make_request(job_id=7)))
    specs = patched["spec"]["pytorchReplicaSpecs"]
    master, worker = (labels_at(specs[t], "template") for t in ("Master", "Worker"))
    assert master["gantry.io/companion"] == "master" and LABEL_REPLICA_BASE not in master
    assert worker[LABEL_REPLICA_BASE] == "0"
    # the operator's Master pod is read as replica 0's companion, Worker 1 as replica 1
    made = {"training.kubeflow.org/replica-type": "master"}
    read = [
        pod_status(
            {
                "metadata": {
                    "name": name,
                    "labels": {**labels, **made, "training.kubeflow.org/replica-index": index},
                },
                "spec": {},
                "status": {"phase": "Pending"},
            }
        )
        for name, labels, index in (("m", master, "0"), ("w1", worker, "1"))
    ]
    assert [(s.replica, s.companion) for s in read if s is not None] == [(0, "master"), (1, "")]


def test_the_gpu_resource_the_controller_uses_decides_what_is_a_companion() -> None:
    """A cluster whose devices are `amd.com/gpu`: a template asking for nvidia.com/gpu asks for
    none of them, so the rule is read with the controller's resource, on both sides."""
    amd = pod(8)
    amd["containers"][0]["resources"]["limits"] = {"amd.com/gpu": "8"}
    obj = rayjob_of(pod(0), ("gpu", 1, amd), suspend=True)
    assert per_replica(shape_rayjob(obj, "amd.com/gpu").payload)[:2] == (1, 8)
    ops = resume_patch(RAYJOB, obj, make_request(job_id=5), "amd.com/gpu")
    head = jsonpatch.apply_patch(obj, ops)["spec"]["rayClusterSpec"]["headGroupSpec"]
    assert head["template"]["metadata"]["labels"]["gantry.io/companion"] == "head"
    # read with nvidia.com/gpu, neither asks for GPUs: both are replicas, nothing a companion
    assert per_replica(shape_rayjob(obj).payload)[:2] == (2, 0)


@pytest.mark.parametrize("ends", [None, False, "true"], ids=["absent", "false", "a-string"])
def test_a_rayjob_that_keeps_its_cluster_after_its_job_is_refused_saying_what_to_set(
    ends: Any,
) -> None:
    """KubeRay keeps a RayJob's cluster after the job unless told (its default); Gantry
    would free the job's GPUs while the cluster's pods still hold them, so it refuses, as
    Kueue does, saying what to set."""
    obj = rayjob_with(pod(8), pod(8))
    if ends is None:
        del obj["spec"]["shutdownAfterJobFinishes"]
    else:
        obj["spec"]["shutdownAfterJobFinishes"] = ends
    with pytest.raises(Refused, match=r"set spec\.shutdownAfterJobFinishes: true"):
        shape_rayjob(obj)
    obj["spec"]["shutdownAfterJobFinishes"] = True
    assert shape_rayjob(obj).payload["replicas"] == 2


def test_every_replica_reserves_its_companions_cpu_as_the_docs_worked_example_says() -> None:
    """docs/kubernetes-native.md, "Companions reserved on every replica": a RayJob of a CPU
    head (16 CPUs, 64 GiB) beside 8 workers of 4 GPUs, 16 CPUs and 64 GiB, in K8sJobMode
    with KubeRay's default submitter (500m, 200 MiB)."""
    body = rayjob_with(pod(0, cpu="16", memory="64Gi"), pod(4, cpu="16", memory="64Gi"))
    body["spec"]["rayClusterSpec"]["workerGroupSpecs"][0]["replicas"] = 8
    # each replica: 16 + 16 + 0.5 = 32.5 CPUs; 65536 + 65536 + 200 = 131272 MiB
    assert per_replica(shape_rayjob(body).payload) == (8, 4, 32500, 131272)


def test_the_worked_examples_replicas_take_a_node_each_where_two_would_fit() -> None:
    """The same job in the engine, on nodes of 8 H100 and 64 CPUs: two replicas of 32.5 CPUs
    do not fit one node (65 > 64), so it waits on 4 nodes whose GPUs it would fill (what it
    needs: 16 + 16 + 16.5 = 48.5 CPUs beside replica 0, 32 beside any other two), and takes
    8 nodes, 4 GPUs each, where there are 8."""
    job = make_job("ray", gpus=4, replicas=8, cpu=32_500, memory=131_272)
    four = [make_node(f"n{i}", cpu=64_000) for i in range(4)]
    waits = cycle(snapshot(four, [job]))
    assert waits.placement_for("ray") is None
    assert "hold 4 of the 8 replicas" in str(waits.reason_for("ray"))
    eight = [make_node(f"n{i}", cpu=64_000) for i in range(8)]
    assert len(set(placed_nodes(cycle(snapshot(eight, [job])), "ray"))) == 8
