"""The pods a RayJob or a TrainJob makes beside its replicas (a RayJob's submitter, a
TrainJob's initializers) count in its Gantry job (scheduler/workloads/companions.py), through
the controller and the daemon over the fake API server: what would not fit with them waits,
saying why (tests/workloads/test_shape_kinds.py has the arithmetic)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from scheduler.jobs.services import job_submit
from scheduler.models import Job
from scheduler.workloads.kinds import RAYJOB, TRAINJOB
from tests.conftest import build_org, job_spec
from tests.k8s.conftest import started_fake
from tests.workloads.test_controller import World, world
from tests.workloads.test_kinds_queued import IMAGE, RAY_ENDS, Operator, _obj, events, trainjob

__all__ = ["world"]  # the fixture, for this module
Obj = dict[str, Any]


@pytest.fixture
def small(db: Any) -> Iterator[World]:
    """One 8-GPU node of 64 CPUs."""
    fake = started_fake()
    fake.add_node("k8s-gpu-1", cpu="64")
    made = World(build_org(), fake)
    yield made
    made.api.close()
    fake.stop()


def head_only(name: str, gpus: int, cpu: str, **spec: Any) -> Obj:
    resources = {"limits": {"nvidia.com/gpu": str(gpus)}, "requests": {"cpu": cpu, "memory": "8Gi"}}
    head = {"containers": [{"name": "ray-head", "image": IMAGE, "resources": resources}]}
    cluster = {"headGroupSpec": {"template": {"spec": head}}, "workerGroupSpecs": []}
    body = {"entrypoint": "python train.py", "rayClusterSpec": cluster, **RAY_ENDS, **spec}
    return _obj(RAYJOB, name, body, {})


def occupy_two_cpus(world: World) -> Job:
    """A portal job of 1 GPU and 2 CPUs, admitted on the node: 7 GPUs and 62 CPUs are left."""
    spec = job_spec(replicas=1, resources={"gpus": 1, "cpu_milli": 2000, "memory_mib": 1024})
    other, _ = job_submit(user=world.org.users["alice"], project=world.org.proj_alpha, payload=spec)
    world.step()
    other.refresh_from_db()
    assert other.state in ("admitted", "binding", "running"), other.reason
    return other


@pytest.mark.parametrize(
    ("mode", "admitted"),
    [
        # 61.8 CPUs for the head and 0.5 for KubeRay's default submitter: 62.3 > 62 left
        pytest.param("K8sJobMode", False, id="its-submitter-does-not-fit"),
        # no submitter pod: 61.8 <= 62
        pytest.param("HTTPMode", True, id="no-submitter"),
    ],
)
def test_a_rayjob_whose_submitter_would_not_fit_waits_saying_why(
    small: World, mode: str, admitted: bool
) -> None:
    occupy_two_cpus(small)
    operator = Operator(small, RAYJOB)
    operator.create(head_only("ray", gpus=7, cpu="61800m", submissionMode=mode))
    small.step()
    small.step()
    job = Job.objects.get(spec__workload__kind="RayJob")
    assert job.cpu_milli == (62300 if mode == "K8sJobMode" else 61800)
    if admitted:
        assert job.state in ("admitted", "binding"), job.reason
        assert operator.get("ray")["spec"]["suspend"] is False
        return
    assert job.state == "queued", job.reason
    assert operator.get("ray")["spec"]["suspend"] is True
    small.controller.sync()
    queued = [m for r, m in events(small, "RayJob") if r == "Queued"]
    assert any("also has 62300 mCPU" in m for m in queued), queued
    assert "62300 mCPU" in operator.get("ray")["metadata"]["annotations"]["gantry.io/reason"]


def runtime(kind: str, name: str, initializer_cpu: str) -> Obj:
    initializer = {
        "name": "model-initializer",
        "template": {
            "spec": {
                "template": {
                    "spec": {
                        "containers": [
                            {
                                "name": "model-initializer",
                                "image": IMAGE,
                                "resources": {"requests": {"cpu": initializer_cpu}},
                            }
                        ]
                    }
                }
            }
        },
    }
    return {
        "apiVersion": "trainer.kubeflow.org/v1alpha1",
        "kind": kind,
        "metadata": {"name": name},
        "spec": {"template": {"spec": {"replicatedJobs": [initializer]}}},
    }


@pytest.mark.parametrize(
    ("ref", "expected_cpu"),
    [
        # the node's 2 CPUs and the cluster runtime's initializer's 3
        pytest.param({"name": "torch"}, 5000, id="cluster-runtime"),
        # the namespace's own runtime of the same name: its initializer's 1
        pytest.param({"name": "torch", "kind": "TrainingRuntime"}, 3000, id="namespaced-runtime"),
        # a runtime that does not exist: the nodes alone
        pytest.param({"name": "absent"}, 2000, id="no-such-runtime"),
    ],
)
def test_a_trainjob_counts_the_initializers_its_runtime_declares(
    world: World, ref: Obj, expected_cpu: int
) -> None:
    world.fake.create(
        "clustertrainingruntimes", "", runtime("ClusterTrainingRuntime", "torch", "3")
    )
    namespaced = runtime("TrainingRuntime", "torch", "1")
    world.fake.create("trainingruntimes", world.namespace, namespaced)
    body = trainjob("t")
    body["spec"]["runtimeRef"] = ref
    Operator(world, TRAINJOB).create(body)
    world.controller.sync()
    job = Job.objects.get(spec__workload__kind="TrainJob")
    assert (job.replicas, job.gpus_per_replica, job.cpu_milli) == (2, 8, expected_cpu)


def test_a_runtime_that_cannot_be_read_holds_back_its_trainjob_alone(world: World) -> None:
    """The API server refuses the read (a 403: the controller's account not yet allowed to
    read runtimes): the pass queues every other object, the TrainJob is queued at the next
    pass that reads its runtime."""
    cluster = runtime("ClusterTrainingRuntime", "torch", "3")
    world.fake.create("clustertrainingruntimes", "", cluster)
    Operator(world, TRAINJOB).create(trainjob("t"))
    Operator(world, RAYJOB).create(head_only("ray", gpus=8, cpu="2"))
    world.fake.inject("403", r"/clustertrainingruntimes/torch$", method="GET")
    world.controller.sync()
    assert list(Job.objects.values_list("spec__workload__kind", flat=True)) == ["RayJob"]
    world.controller.sync()
    job = Job.objects.get(spec__workload__kind="TrainJob")
    assert job.cpu_milli == 5000  # its node's 2 CPUs and the initializer's 3
