"""What a JobSet, RayJob or TrainJob asks for as one Gantry job
(scheduler/workloads/shape_kinds.py), the pods beside its replicas included
(scheduler/workloads/companions.py), and the patch that admits it
(scheduler/backends/kubernetes/resume.py): pure, no server."""

from __future__ import annotations

from typing import Any

import jsonpatch
import pytest

from scheduler.backends.kubernetes.resume import (
    LABEL_REPLICA_BASE,
    LABEL_REPLICA_STRIDE,
    resume_patch,
)
from scheduler.backends.workloads import JOBSET, RAYJOB, TRAINJOB, parse_ref, workload_ref
from scheduler.workloads.companions import runtime_ref
from scheduler.workloads.shape import Refused
from scheduler.workloads.shape_kinds import shape_jobset, shape_rayjob, shape_trainjob
from tests.k8s.builders import make_request

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
            jobset(replicated("a", 1, 1, pod(8)), replicated("b", 1, 1, pod(0))),
            "'a' 8, replicated job 'b' 0",
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
        "spec": {"rayClusterSpec": cluster, "activeDeadlineSeconds": 600},
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


def rayjob_with(head: Obj, worker: Obj, **spec: Any) -> Obj:
    groups = [{"groupName": "gpu", "replicas": 1, "template": {"spec": worker}}]
    cluster = {"headGroupSpec": {"template": {"spec": head}}, "workerGroupSpecs": groups}
    return {"metadata": {"name": "r"}, "spec": {"rayClusterSpec": cluster, **spec}}


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
