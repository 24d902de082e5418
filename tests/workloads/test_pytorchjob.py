"""PyTorchJobs (kubeflow.org/v1) created in Kubernetes queue through Gantry (issue 37), over
the fake API server with the daemon on a fake clock, as test_kinds_queued.py queues the other
kinds: held suspended (`spec.runPolicy.suspend`), shaped from its Master and Worker replicas,
admitted (its templates labelled once, unsuspended), the training operator's pods bound as
replicas (Master 0, Worker i 1 + i), preempted (suspended again), deleted (cancelled), ended
(its Succeeded or Failed condition). The training operator is played here (`TrainingOperator`);
tests/workloads/test_kinds_real.py plays it on the real control plane."""

from __future__ import annotations

import copy
from typing import Any

import jsonpatch
import pytest

from scheduler.backends.kubernetes.resume import resume_patch
from scheduler.backends.kubernetes.status import pod_status
from scheduler.backends.workloads import PYTORCHJOB as RESUMABLE
from scheduler.backends.workloads import parse_ref, workload_ref
from scheduler.models import Allocation, Job
from scheduler.workloads.kinds import PYTORCHJOB
from scheduler.workloads.mutate import plan
from scheduler.workloads.shape_kinds import shape_pytorchjob
from tests.k8s.builders import make_request
from tests.workloads.test_controller import World, cancel_and_readmit, preempt_running, world
from tests.workloads.test_kinds_queued import events, pod_spec

__all__ = ["world"]  # the fixture, for this module
Obj = dict[str, Any]


def pytorchjob(
    name: str, gpus: int = 8, workers: int = 1, master_gpus: int | None = None, **labels: str
) -> Obj:
    master = {"replicas": 1, "restartPolicy": "OnFailure", "template": {"spec": pod_spec(gpus)}}
    if master_gpus is not None:
        master["template"] = {"spec": pod_spec(master_gpus)}
    worker = {
        "replicas": workers,
        "restartPolicy": "OnFailure",
        "template": {"spec": pod_spec(gpus)},
    }
    return {
        "apiVersion": "kubeflow.org/v1",
        "kind": "PyTorchJob",
        "metadata": {"name": name, "labels": dict(labels)},
        "spec": {"pytorchReplicaSpecs": {"Master": master, "Worker": worker}},
    }


class TrainingOperator:
    """Plays Kubeflow's training operator (v1.9.3) on the fake: an unsuspended PyTorchJob gets
    a pod per replica, from its replica type's template, named and labelled as the operator
    names and labels them (`<job>-master-0`, `<job>-worker-<i>`; replica type in lower case
    and replica index); a suspended one has its pods deleted."""

    def __init__(self, world: World) -> None:
        self.world = world

    def get(self, name: str) -> Obj:
        found = self.world.fake.get("pytorchjobs", self.world.namespace, name)
        assert found is not None
        return found

    def create(self, body: Obj, user: str = "alice") -> Obj:
        held = jsonpatch.apply_patch(copy.deepcopy(body), plan(PYTORCHJOB, body, user))
        return self.world.fake.create("pytorchjobs", self.world.namespace, held)

    def suspended(self, name: str) -> bool | None:
        return RESUMABLE.suspended(self.get(name))

    def pods(self, name: str) -> list[str]:
        return sorted(
            p["metadata"]["name"]
            for p in self.world.fake.list_objects("pods", self.world.namespace, {})["items"]
            if p["metadata"]["labels"].get("training.kubeflow.org/job-name") == name
        )

    def step(self, name: str) -> list[str]:
        obj, fake, namespace = self.get(name), self.world.fake, self.world.namespace
        if self.suspended(name):
            for pod in self.pods(name):
                fake.delete("pods", namespace, pod, 0)
            return []
        if self.pods(name):
            return self.pods(name)
        # Workers first: the operator makes them in no order a client may rely on.
        for rtype in ("Worker", "Master"):
            replica_spec = obj["spec"]["pytorchReplicaSpecs"][rtype]
            template = replica_spec["template"]
            for index in range(replica_spec["replicas"]):
                labels = {
                    **template.get("metadata", {}).get("labels", {}),
                    "training.kubeflow.org/operator-name": "pytorchjob-controller",
                    "training.kubeflow.org/job-name": name,
                    "training.kubeflow.org/replica-type": rtype.lower(),
                    "training.kubeflow.org/replica-index": str(index),
                }
                meta = {"name": f"{name}-{rtype.lower()}-{index}", "labels": labels}
                fake.create(
                    "pods", namespace, {"metadata": meta, "spec": copy.deepcopy(template["spec"])}
                )
        return self.pods(name)

    def end(self, name: str, condition: str) -> None:
        """The operator's end: its pods exit (or not), and its condition says so."""
        obj = self.get(name)
        phase = "Succeeded" if condition == "Succeeded" else "Failed"
        for pod in self.pods(name):
            self.world.fake.set_pod_status(self.world.namespace, pod, {"phase": phase})
        obj["status"] = {"conditions": [{"type": condition, "status": "True"}]}
        self.world.fake.replace("pytorchjobs", self.world.namespace, name, obj)


def job_of() -> Job:
    return Job.objects.get(spec__workload__kind="PyTorchJob")


def test_a_pytorchjob_is_held_by_its_run_policy() -> None:
    held = jsonpatch.apply_patch(pytorchjob("x"), plan(PYTORCHJOB, pytorchjob("x"), "alice"))
    assert held["spec"]["runPolicy"]["suspend"] is True
    assert "suspend" not in held["spec"]
    assert RESUMABLE.suspend_pointer == "/spec/runPolicy/suspend"


def test_a_workers_only_pytorchjob_is_its_workers_and_keeps_its_run_policys_deadline() -> None:
    body = pytorchjob("elastic", gpus=2, workers=3)
    del body["spec"]["pytorchReplicaSpecs"]["Master"]
    body["spec"]["runPolicy"] = {"activeDeadlineSeconds": 600}
    payload = shape_pytorchjob(body).payload
    assert (payload["replicas"], payload["resources"]["gpus"], payload["max_runtime_s"]) == (
        3,
        2,
        600,
    )
    ops = resume_patch(RESUMABLE, body, make_request(job_id=5))
    (labelled,) = [op for op in ops if "Worker" in op["path"]]
    assert labelled["path"] == "/spec/pytorchReplicaSpecs/Worker/template/metadata"
    assert labelled["value"]["labels"]["gantry.io/replica-base"] == "0"
    assert ops[-1] == {"op": "replace", "path": "/spec/runPolicy/suspend", "value": False}
    ref = workload_ref({"kind": "PyTorchJob", "name": "elastic"})
    assert ref == "pytorchjobs/elastic" and parse_ref(ref) == (RESUMABLE, "elastic")


@pytest.mark.parametrize(
    ("labels", "replica"),
    [
        ({"training.kubeflow.org/replica-type": "master", "gantry.io/replica-base": "0"}, 0),
        ({"training.kubeflow.org/replica-type": "worker", "gantry.io/replica-base": "1"}, 3),
        ({"training.kubeflow.org/replica-type": "worker"}, -1),  # no base: adopted by order
    ],
    ids=["master", "worker-2", "unlabelled-template"],
)
def test_an_operators_pod_is_the_replica_its_type_and_index_say(
    labels: dict[str, str], replica: int
) -> None:
    index = "2" if replica == 3 else "0"
    meta = {
        "name": "p",
        "namespace": "n",
        "labels": {
            "gantry.io/job-id": "5",
            "training.kubeflow.org/replica-index": index,
            **labels,
        },
    }
    status = pod_status({"metadata": meta, "spec": {}, "status": {"phase": "Pending"}})
    assert status is not None and (status.job_id, status.replica) == (5, replica)


def test_a_pytorchjob_is_queued_admitted_its_pods_bound_as_replicas_run_and_ended(
    world: World,
) -> None:
    """A Master and two Workers of 4 GPUs: one gang of 3 x 4 GPUs, unsuspended once placed,
    its templates labelled once; the Master is replica 0, Worker i replica 1 + i whatever
    order the operator made them in; running, then succeeded as its condition says."""
    operator = TrainingOperator(world)
    operator.create(pytorchjob("ddp", gpus=4, workers=2))
    world.controller.sync()
    job = job_of()
    assert (job.replicas, job.gpus_per_replica, job.state) == (3, 4, "queued")
    assert [r for r, _ in events(world, "PyTorchJob")] == ["Queued"]
    assert operator.suspended("ddp") is True
    world.step()  # placed: labelled and unsuspended
    obj = operator.get("ddp")
    assert operator.suspended("ddp") is False
    specs = obj["spec"]["pytorchReplicaSpecs"]
    bases = {t: specs[t]["template"]["metadata"]["labels"]["gantry.io/replica-base"] for t in specs}
    assert bases == {"Master": "0", "Worker": "1"}
    assert {specs[t]["template"]["metadata"]["labels"]["gantry.io/job-id"] for t in specs} == {
        str(job.pk)
    }
    names = operator.step("ddp")
    world.step()  # adopted and bound
    replicas = {a.pod_name: a.replica for a in Allocation.objects.filter(job=job)}
    assert replicas == {"ddp-master-0": 0, "ddp-worker-0": 1, "ddp-worker-1": 2}
    assert all(world.pod(n)["spec"].get("nodeName") for n in names)
    for name in names:
        world.fake.run_container(world.namespace, name)
    world.step()
    job.refresh_from_db()
    assert job.state == "running"
    world.controller.sync()
    operator.end("ddp", "Succeeded")
    world.step()
    world.step()
    job.refresh_from_db()
    assert job.state == "succeeded", job.reason
    reasons = sorted(r for r, _ in events(world, "PyTorchJob"))
    assert reasons == ["Admitted", "Queued", "Running", "Succeeded"]
    statuses = operator.get("ddp")["metadata"]["annotations"]
    assert statuses["gantry.io/status"] == "Succeeded"


def test_a_preempted_pytorchjob_is_suspended_and_admitted_again_labelled_once(
    world: World,
) -> None:
    operator = TrainingOperator(world)
    operator.create(pytorchjob("low", **{"gantry.io/priority-class": "low"}))
    world.step()
    low = job_of()
    high = preempt_running(world, low, operator.step)
    assert operator.suspended("low") is True
    assert operator.pods("low") == []
    world.controller.sync()
    assert "Preempted" in [r for r, _ in events(world, "PyTorchJob")]
    labelled = copy.deepcopy(operator.get("low")["spec"]["pytorchReplicaSpecs"])
    cancel_and_readmit(world, high, operator.step)
    assert operator.suspended("low") is False
    assert operator.get("low")["spec"]["pytorchReplicaSpecs"] == labelled  # only unsuspended
    bound = Allocation.objects.filter(job=low, attempt=1, bound_at__isnull=False)
    assert sorted((a.pod_name, a.replica) for a in bound) == [
        ("low-master-0", 0),
        ("low-worker-0", 1),
    ]
    assert all(world.pod(a.pod_name)["spec"].get("nodeName") == a.node.name for a in bound)


def test_a_running_pytorchjob_left_unsuspended_without_a_live_job_is_suspended(
    world: World,
) -> None:
    """The sweep reads the run policy's flag: a PyTorchJob unsuspended behind Gantry's back
    (its job still queued) is suspended again."""
    operator = TrainingOperator(world)
    operator.create(pytorchjob("sneaky", gpus=8, workers=3))  # 4 x 8 GPUs: never placed here
    world.controller.sync()
    obj = operator.get("sneaky")
    obj["spec"]["runPolicy"]["suspend"] = False
    world.fake.replace("pytorchjobs", world.namespace, "sneaky", obj)
    world.step()
    assert job_of().state == "queued"
    assert operator.suspended("sneaky") is True


def test_a_deleted_pytorchjob_cancels_its_job(world: World) -> None:
    TrainingOperator(world).create(pytorchjob("gone"))
    world.controller.sync()
    world.fake.delete("pytorchjobs", world.namespace, "gone", 0)
    world.controller.sync()
    cancelled = job_of()
    assert cancelled.state == "cancelled"
    assert "PyTorchJob gone was deleted in Kubernetes" in cancelled.events.last().message


def test_a_failed_pytorchjob_fails_its_running_job(world: World) -> None:
    operator = TrainingOperator(world)
    operator.create(pytorchjob("bad"))
    world.step()
    for name in operator.step("bad"):
        world.fake.run_container(world.namespace, name)
    world.step()
    world.step()
    job = job_of()
    assert job.state == "running"
    operator.end("bad", "Failed")
    world.step()
    world.step()
    job.refresh_from_db()
    assert job.state == "failed", job.reason


def test_a_short_pytorchjob_that_succeeds_before_gantry_sees_it_run_succeeds(
    world: World,
) -> None:
    """Its pods bound, run and end, and the operator's Succeeded condition lands, all before
    the daemon's next cycle sees them running: the controller leaves the job to the daemon,
    which reads the pods' end (it was cancelled as "finished before Gantry stopped them")."""
    operator = TrainingOperator(world)
    operator.create(pytorchjob("quick"))
    world.step()  # placed and unsuspended
    operator.step("quick")
    world.step()  # adopted and bound
    job = job_of()
    assert job.state == "binding"
    operator.end("quick", "Succeeded")
    world.controller.sync()
    job.refresh_from_db()
    assert job.state == "binding"
    world.step()
    world.step()
    job.refresh_from_db()
    assert job.state == "succeeded", job.reason


def test_a_pytorchjob_that_succeeded_while_queued_ends(world: World) -> None:
    operator = TrainingOperator(world)
    operator.create(pytorchjob("done"))
    world.controller.sync()
    operator.end("done", "Succeeded")
    world.controller.sync()
    queued = job_of()
    assert queued.state == "cancelled"
    assert "its PyTorchJob is complete in Kubernetes" in queued.events.last().message


@pytest.mark.parametrize(
    ("body", "why"),
    [
        (pytorchjob("uneven", gpus=8, master_gpus=4), "Master 4, Worker 8"),
        ("two-masters", "2 Master replicas"),
        ("launcher", "['Launcher'] are not Master or Worker"),
    ],
    ids=["gpus-differ", "two-masters", "unknown-type"],
)
def test_what_cannot_be_one_job_is_refused_saying_why(world: World, body: Any, why: str) -> None:
    obj = body if isinstance(body, dict) else pytorchjob("bad")
    specs = obj["spec"]["pytorchReplicaSpecs"]
    if body == "two-masters":
        specs["Master"]["replicas"] = 2
    elif body == "launcher":
        specs["Launcher"] = copy.deepcopy(specs["Worker"])
    operator = TrainingOperator(world)
    operator.create(obj)
    world.controller.sync()
    world.controller.sync()
    assert not Job.objects.exists()
    (told,) = events(world, "PyTorchJob")  # once, not every pass
    assert told[0] == "Refused" and why in told[1], told
    assert operator.suspended(obj["metadata"]["name"]) is True
