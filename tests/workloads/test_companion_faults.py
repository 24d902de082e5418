"""A companion pod that fails (issue 37, scheduler/daemon/companions/faults.py): a RayJob's CPU
head, a JobSet's driver or a PyTorchJob's CPU Master bound beside replica 0 whose pod ends
Failed. Its user is told (the job's reason, an event on the object); where the operator will
not end the object, the attempt ends per the job's retry policy.

Over the fake API server with the daemon on a fake clock, the operators played as they
behave: KubeRay deletes a head pod that ended and makes it again; the training operator
fails a PyTorchJob whose Master failed and, its default `cleanPodPolicy: None`, leaves the
Workers running, suspended or not (a finished job is only cleaned up)."""

from __future__ import annotations

import copy
import threading
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from scheduler.backends.base import FailureReason, PodPhase, PodStatus
from scheduler.daemon.companions.faults import companion_faults
from scheduler.models import Allocation, Job
from scheduler.workloads.kinds import JOBSET, RAYJOB
from tests.k8s.test_node_informer import until
from tests.workloads.test_companion_binding import (
    cpu_head_rayjob,
    head_node,
    jobset_with_driver,
    node_of,
)
from tests.workloads.test_controller import World, world
from tests.workloads.test_kinds_queued import Operator, events
from tests.workloads.test_pytorchjob import TrainingOperator, pytorchjob

__all__ = ["world"]  # the fixture, for this module
Obj = dict[str, Any]


def fail(world: World, name: str, reason: str = "Error", exit_code: int = 1) -> None:
    """The pod's container ended (`restartPolicy: Never`): the pod is Failed."""
    terminated = {"exitCode": exit_code, "reason": reason, "finishedAt": datetime.now(UTC)}
    terminated["finishedAt"] = terminated["finishedAt"].strftime("%Y-%m-%dT%H:%M:%SZ")
    container = {"name": "main", "ready": False, "restartCount": 0}
    status = {
        "phase": "Failed",
        "containerStatuses": [{**container, "state": {"terminated": terminated}}],
    }
    world.fake.set_pod_status(world.namespace, name, status)


def running(world: World, made: list[str], kind: str) -> Job:
    """Run the pods `made`, and step until the job of `kind` runs."""
    for name in made:
        world.fake.run_container(world.namespace, name)
    world.step()
    world.step()
    job = Job.objects.get(spec__workload__kind=kind)
    assert job.state == "running", job.reason
    return job


class FailingTrainingOperator(TrainingOperator):
    """The training operator (v1.9.3) once a PyTorchJob's Master failed with `restartPolicy:
    Never`: the PyTorchJob is Failed, and a finished job is only cleaned per its
    cleanPodPolicy (None by default): its Workers keep running, suspended or not."""

    finished = False

    def step(self, name: str) -> list[str]:
        return self.pods(name) if self.finished else super().step(name)

    def fail_job(self, name: str) -> None:
        obj = self.get(name)
        message = f"PyTorchJob {name} is failed because 1 Master replica(s) failed."
        condition = {"type": "Failed", "status": "True", "reason": "PyTorchJobFailed"}
        obj["status"] = {"conditions": [{**condition, "message": message}]}
        self.world.fake.replace("pytorchjobs", self.world.namespace, name, obj)
        self.finished = True


def test_a_pytorchjobs_failed_cpu_master_is_told_and_its_job_fails_with_the_pytorchjob(
    world: World,
) -> None:
    """The Master (no GPUs, beside two 8-GPU Workers) exits 1: Gantry tells it (the job's
    reason, a Warning on the PyTorchJob); its operator then fails the PyTorchJob, leaving the
    Workers running, and the job fails with it (not left running on the Workers' pods), the
    PyTorchJob suspended and the Workers' GPUs held until their pods go."""
    operator = FailingTrainingOperator(world)
    body = pytorchjob("pt", gpus=8, workers=2, master_gpus=0)
    body["spec"]["pytorchReplicaSpecs"]["Master"]["restartPolicy"] = "Never"
    operator.create(body)
    world.step()
    made = operator.step("pt")
    world.step()
    job = running(world, made, "PyTorchJob")
    fail(world, "pt-master-0")
    world.step()
    job.refresh_from_db()
    assert job.state == "running", job.reason
    assert job.reason.startswith("its Master pod pt-master-0 failed (Error: exit code 1)")
    world.controller.sync()
    warned = [m for r, m in events(world, "PyTorchJob") if "pt-master-0 failed" in m]
    assert len(warned) == 1 and "is running. Warning:" in warned[0], warned
    operator.fail_job("pt")
    world.step()
    world.step()
    job.refresh_from_db()
    assert job.state == "failed", job.reason
    assert job.reason == (
        "its PyTorchJob failed in Kubernetes: PyTorchJob pt is failed because 1 Master "
        "replica(s) failed."
    )
    assert operator.get("pt")["spec"]["runPolicy"]["suspend"] is True
    # The Workers, left running by their operator, keep their GPUs until their pods go.
    assert {"pt-worker-0", "pt-worker-1"} <= set(operator.pods("pt"))
    assert Allocation.objects.filter(job=job, ended_at__isnull=True).count() == 2


def test_a_rayjobs_failed_cpu_head_is_told_and_its_remade_head_bound_beside_replica_0(
    world: World,
) -> None:
    """The CPU head is OOM-killed: KubeRay deletes it and makes it again, so the attempt goes
    on. The user is told (the job's reason, a Warning event on the RayJob, once), and the new
    head is bound beside replica 0."""
    operator = Operator(world, RAYJOB)
    operator.create(cpu_head_rayjob("ray"))
    world.step()
    made = operator.step("ray")
    world.step()
    job = running(world, made, "RayJob")
    fail(world, "ray-head-x", reason="OOMKilled", exit_code=137)
    world.step()
    job.refresh_from_db()
    assert job.state == "running", job.reason
    assert job.reason.startswith("its Ray head pod ray-head-x failed (OOMKilled: OOMKilled)")
    assert "KubeRay makes it again" in job.reason
    # KubeRay (shouldDeletePod): the ended head deleted, a new one made from the template
    head = copy.deepcopy(world.pod("ray-head-x"))
    world.fake.delete("pods", world.namespace, "ray-head-x", 0)
    meta = {"name": "ray-head-y", "labels": head["metadata"]["labels"]}
    world.fake.create(
        "pods", world.namespace, {"metadata": meta, "spec": {**head["spec"], "nodeName": None}}
    )
    world.step()
    world.step()
    job.refresh_from_db()
    assert job.state == "running", job.reason
    assert node_of(world, "ray-head-y") == head_node(job)
    warned = [m for r, m in events(world, "RayJob") if "ray-head-x failed" in m]
    assert len(warned) == 1, warned  # told once
    assert "is running. Warning: its Ray head pod ray-head-x failed" in warned[0]


def test_a_rayjobs_head_that_cannot_pull_its_image_ends_the_attempt_at_the_deadline(
    world: World,
) -> None:
    """The CPU head stays Pending in ImagePullBackOff while the GPU workers run: KubeRay
    waits for ever (the RayJob never leaves Initializing), so past the binding deadline the
    attempt fails, saying which pod and why, not retried, and the RayJob is suspended."""
    operator = Operator(world, RAYJOB)
    operator.create(cpu_head_rayjob("ray"))
    world.step()
    made = operator.step("ray")
    world.step()
    pulling = "Back-off pulling image registry.example.com/nlp/ray:typo"
    world.fake.stay_pending(world.namespace, "ray-head-x", "ImagePullBackOff", pulling)
    job = running(world, [n for n in made if n != "ray-head-x"], "RayJob")
    world.step(300.0)
    job.refresh_from_db()
    assert job.state == "running", job.reason  # within the deadline (600 s)
    world.step(301.0)
    world.step()
    job.refresh_from_db()
    assert job.state == "failed", job.reason
    assert "its Ray head pod ray-head-x cannot pull its image 600 s after binding" in job.reason
    assert pulling in job.reason
    assert operator.get("ray")["spec"]["suspend"] is True


def _driver_running(world: World) -> Job:
    """JobSet js (`jobset_with_driver`) made by its operator and running."""
    operator = Operator(world, JOBSET)
    operator.create(jobset_with_driver("js"))
    world.step()
    made = operator.step("js")
    world.step()
    return running(world, made, "JobSet")


def test_a_jobsets_failed_driver_is_told_and_left_to_its_failure_policy(world: World) -> None:
    """The driver (no GPUs) exits 1: its Job makes it again up to its backoffLimit, then the
    JobSet's failurePolicy decides: Gantry tells, and its GPU replicas go on."""
    job = _driver_running(world)
    fail(world, "js-driver-0-0-x")
    world.step()
    job.refresh_from_db()
    assert job.state == "running", job.reason
    assert job.reason.startswith("its replicated job 'driver' pod js-driver-0-0-x failed")
    assert "the JobSet's failurePolicy" in job.reason
    assert {a.pod_name for a in Allocation.objects.filter(job=job, ended_at__isnull=True)} == {
        "js-w-0-0-x",
        "js-w-1-0-x",
    }


def test_a_jobsets_driver_deleted_before_the_next_cycle_is_told_from_the_watch(
    world: World,
) -> None:
    """JobSet's manager deletes the Jobs of a JobSet its driver failed within a second or two,
    often between two of the daemon's cycles: its pod watch saw the driver Failed, so the
    failure is told though no cycle read the pod (reconcile reads from the watch's cache)."""
    stop = threading.Event()
    assert world.backend.watch_pods(stop, timeout_s=30).wait(5.0)  # the first list
    try:
        job = _driver_running(world)
        informer = world.backend.informer
        assert informer is not None

        def cached(phase: PodPhase | None) -> bool:
            pods = {p.name: p.phase for p in informer.pods() or ()}
            return pods.get("js-driver-0-0-x") == phase

        fail(world, "js-driver-0-0-x")
        until(lambda: cached(PodPhase.FAILED), "the watch never saw the driver Failed")
        world.fake.delete("pods", world.namespace, "js-driver-0-0-x", 0)
        until(lambda: cached(None), "the watch never saw the driver deleted")
        world.step()
        job.refresh_from_db()
        assert job.reason.startswith("its replicated job 'driver' pod js-driver-0-0-x failed")
    finally:
        stop.set()
        world.backend.close_watches()


def _pod(name: str, companion: str, *, node: str = "n1", attempt: int = 0, **kw: Any) -> PodStatus:
    fields: dict[str, Any] = {"phase": PodPhase.FAILED, "reason": FailureReason.ERROR}
    fields.update(kw)
    return PodStatus(name, "ns", 7, attempt, 0, node, companion=companion, **fields)


KINDS = {
    "rayjobs": "RayJob",
    "jobsets": "JobSet",
    "trainjobs": "TrainJob",
    "pytorchjobs": "PyTorchJob",
}


def _row(plural: str, state: str = "running") -> dict[str, Any]:
    """Job 7's row as reconcile reads it: its state, attempt 0, its object of kind `plural`."""
    workload = {"kind": KINDS[plural], "namespace": "ns", "name": "w", "uid": "u"}
    return {"id": 7, "state": state, "attempt": 0, "spec__workload": workload}


NOW = datetime(2026, 12, 6, 12, 0, tzinfo=UTC)
DEADLINE = timedelta(seconds=600)
# replica 0 of job 7's attempt 0, bound on n1 10 minutes and 1 second ago
HEAD = [
    {
        "job_id": 7,
        "attempt": 0,
        "replica": 0,
        "end_reason": "",
        "node__name": "n1",
        "bound_at": NOW - DEADLINE - timedelta(seconds=1),
    }
]


def faults(rows: dict[int, Any], pods: dict[str, PodStatus], now: datetime = NOW) -> Any:
    return companion_faults(HEAD, rows, pods, now, DEADLINE)


@pytest.mark.parametrize(
    ("plural", "companion", "ends", "says"),
    [
        ("rayjobs", "head", False, "its Ray head pod p failed (Error); KubeRay makes it again"),
        ("rayjobs", "worker-group-cpu", False, "its Ray worker group 'cpu' pod p failed"),
        ("rayjobs", "submitter", False, "KubeRay's submitter Job retries up to its backoffLimit"),
        ("jobsets", "driver", False, "its replicated job 'driver' pod p failed"),
        ("trainjobs", "dataset-initializer", False, "its dataset-initializer pod p failed"),
        ("pytorchjobs", "master", False, "its Master pod p failed (Error); the training operator"),
    ],
    ids=["ray-head", "ray-cpu-group", "ray-submitter", "jobset-driver", "initializer", "master"],
)
def test_what_each_operator_does_decides_what_gantry_does(
    plural: str, companion: str, ends: bool, says: str
) -> None:
    (fault,) = faults({7: _row(plural)}, {"p": _pod("p", companion)}).values()
    assert (fault.ends, fault.reason) == (ends, FailureReason.ERROR)
    assert says in fault.text


@pytest.mark.parametrize(
    ("pod", "state"),
    [
        (_pod("p", "head", phase=PodPhase.RUNNING, reason=None), "running"),  # not failed
        (_pod("p", "head", node="n2"), "running"),  # not beside its replica 0
        (_pod("p", "head", attempt=1), "running"),  # an older attempt's? a newer one's
        (_pod("p", "head", deleting=True), "running"),  # going already
        (_pod("p", ""), "running"),  # a replica: the judge's
        (_pod("p", "head"), "admitted"),  # not bound yet: reconcile adopts or releases it
    ],
    ids=["running", "elsewhere", "other-attempt", "deleting", "replica", "admitted"],
)
def test_a_pod_that_is_not_a_placed_jobs_failed_companion_is_no_fault(
    pod: PodStatus, state: str
) -> None:
    assert faults({7: _row("rayjobs", state)}, {"p": pod}) == {}


def test_a_companion_that_cannot_pull_its_image_ends_the_attempt_past_the_deadline() -> None:
    """Pending, pulling its image: nothing within the binding deadline after replica 0 was
    bound; past it, the attempt ends whatever the kind (no operator ends it)."""
    pulling = _pod("p", "driver", phase=PodPhase.PENDING, reason=FailureReason.IMAGE_PULL)
    rows = {7: _row("jobsets")}
    assert faults(rows, {"p": pulling}, now=NOW - timedelta(seconds=2)) == {}
    (fault,) = faults(rows, {"p": pulling}).values()
    assert (fault.ends, fault.reason) == (True, FailureReason.IMAGE_PULL)
    assert "pod p cannot pull its image 600 s after binding" in fault.text
