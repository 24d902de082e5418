"""JobSets, RayJobs, TrainJobs and LeaderWorkerSets created in Kubernetes queue through Gantry
(issue 37), over the fake API server with the daemon on a fake clock: queued with the reason
in their events, admitted (unsuspended, or an LWS group's gates removed), their controllers'
pods bound where Gantry placed them, preempted (suspended again), deleted (cancelled), ended
(the job ends as the object did). Each kind's controller is played here (`Operator`), as
test_controller.py plays the Job controller; tests/workloads/test_kinds_real.py runs JobSet's
and LWS's real managers."""

from __future__ import annotations

import copy
from typing import Any

import jsonpatch
import pytest

from scheduler.jobs.services import job_submit
from scheduler.models import Allocation, Job
from scheduler.workloads.kinds import JOBSET, LEADERWORKERSET, POD, RAYJOB, TRAINJOB, Kind
from scheduler.workloads.mutate import GATE, plan
from tests.conftest import job_spec
from tests.workloads.test_controller import World, cancel_and_readmit, preempt_running, world

__all__ = ["world"]  # the fixture, for this module
Obj = dict[str, Any]
IMAGE = "registry.example.com/nlp/bert:1.2"
# A RayJob Gantry queues ends its cluster with its job.
RAY_ENDS = {"shutdownAfterJobFinishes": True}


def pod_spec(gpus: int) -> Obj:
    resources = {"limits": {"nvidia.com/gpu": str(gpus)}, "requests": {"cpu": "2", "memory": "8Gi"}}
    container = {"name": "main", "image": IMAGE, "command": ["python"], "resources": resources}
    return {"restartPolicy": "Never", "containers": [container]}


def jobset(name: str, gpus: int = 8, jobs: int = 2, parallelism: int = 1, **labels: str) -> Obj:
    job = {"parallelism": parallelism, "completions": parallelism, "completionMode": "Indexed"}
    job["template"] = {"spec": pod_spec(gpus)}
    replicated = {"name": "w", "replicas": jobs, "template": {"spec": job}}
    return _obj(JOBSET, name, {"replicatedJobs": [replicated]}, labels)


def rayjob(name: str, gpus: int = 8, workers: int = 1, **labels: str) -> Obj:
    group = {"groupName": "gpu", "replicas": workers, "template": {"spec": pod_spec(gpus)}}
    cluster = {"headGroupSpec": {"template": {"spec": pod_spec(gpus)}}, "workerGroupSpecs": [group]}
    spec = {"entrypoint": "python train.py", "rayClusterSpec": cluster, **RAY_ENDS}
    return _obj(RAYJOB, name, spec, labels)


def trainjob(name: str, gpus: int = 8, nodes: int = 2, **labels: str) -> Obj:
    resources = {"limits": {"nvidia.com/gpu": str(gpus)}, "requests": {"cpu": "2"}}
    trainer = {"numNodes": nodes, "image": IMAGE, "resourcesPerNode": resources}
    return _obj(TRAINJOB, name, {"runtimeRef": {"name": "torch"}, "trainer": trainer}, labels)


def _obj(kind: Kind, name: str, spec: Obj, labels: dict[str, str]) -> Obj:
    meta = {"name": name, "labels": dict(labels)}
    return {
        "apiVersion": f"{kind.group}/{kind.version}",
        "kind": kind.kind,
        "metadata": meta,
        "spec": spec,
    }


class Operator:
    """Plays a kind's controller on the fake: an unsuspended object gets its pods (from its
    templates, with the labels its real controller sets, under names of its own); a
    suspended one has them deleted."""

    def __init__(self, world: World, kind: Kind) -> None:
        self.world, self.kind = world, kind

    def get(self, name: str) -> Obj:
        found = self.world.fake.get(self.kind.plural, self.world.namespace, name)
        assert found is not None
        return found

    def create(self, body: Obj, user: str = "alice") -> Obj:
        held = jsonpatch.apply_patch(copy.deepcopy(body), plan(self.kind, body, user))
        return self.world.fake.create(self.kind.plural, self.world.namespace, held)

    def pods(self, name: str) -> list[str]:
        return sorted(
            p["metadata"]["name"]
            for p in self.world.fake.list_objects("pods", self.world.namespace, {})["items"]
            if p["metadata"]["labels"].get("test/owner") == name
        )

    def step(self, name: str) -> list[str]:
        obj, fake, namespace = self.get(name), self.world.fake, self.world.namespace
        if obj["spec"]["suspend"]:
            for pod in self.pods(name):
                fake.delete("pods", namespace, pod, 0)
            return []
        if not self.pods(name):
            for pod_name, template, labels in self._made(obj):
                meta = {
                    "name": pod_name,
                    "labels": {
                        **template.get("metadata", {}).get("labels", {}),
                        **labels,
                        "test/owner": name,
                    },
                }
                fake.create(
                    "pods", namespace, {"metadata": meta, "spec": copy.deepcopy(template["spec"])}
                )
        return self.pods(name)

    def _made(self, obj: Obj) -> list[tuple[str, Obj, dict[str, str]]]:
        name, spec = obj["metadata"]["name"], obj["spec"]
        if self.kind is JOBSET:
            return [
                (
                    f"{name}-{rj['name']}-{j}-{c}-x",
                    rj["template"]["spec"]["template"],
                    _jobset_labels(name, rj["name"], j, c),
                )
                for rj in spec["replicatedJobs"]
                for j in range(rj["replicas"])
                for c in range(rj["template"]["spec"]["parallelism"])
            ]
        if self.kind is RAYJOB:
            cluster = spec["rayClusterSpec"]
            head = (
                f"{name}-head-x",
                cluster["headGroupSpec"]["template"],
                {"ray.io/node-type": "head"},
            )
            workers = [
                (
                    f"{name}-{g['groupName']}-worker-{i}",
                    g["template"],
                    {"ray.io/node-type": "worker", "ray.io/group": g["groupName"]},
                )
                for g in cluster["workerGroupSpecs"]
                for i in range(g["replicas"])
            ]
            return [head, *workers]
        # A TrainJob: the Trainer's JobSet, its `node` job, with Gantry's runtime patch applied.
        (patch,) = [p for p in spec["runtimePatches"] if p["manager"] == "gantry.io/scheduler"]
        jobs = patch["trainingRuntimeSpec"]["template"]["spec"]["replicatedJobs"]
        (node,) = [j for j in jobs if j["name"] == "node"]  # no initializer in its runtime
        trainer = spec["trainer"]
        container = {
            "name": "node",
            "image": trainer["image"],
            "resources": trainer["resourcesPerNode"],
        }
        template = {
            "metadata": node["template"]["spec"]["template"]["metadata"],
            "spec": {
                "schedulerName": "gantry",
                "restartPolicy": "Never",
                "containers": [container],
            },
        }
        return [
            (f"{name}-node-0-{c}-x", template, _jobset_labels(name, "node", 0, c))
            for c in range(trainer["numNodes"])
        ]


def _jobset_labels(jobset: str, replicated: str, job: int, completion: int) -> dict[str, str]:
    """What a JobSet's Job's pod carries: the JobSet's labels, then the Job controller's."""
    return {
        "jobset.sigs.k8s.io/jobset-name": jobset,
        "jobset.sigs.k8s.io/replicatedjob-name": replicated,
        "jobset.sigs.k8s.io/job-index": str(job),
        "batch.kubernetes.io/job-name": f"{jobset}-{replicated}-{job}",
        "batch.kubernetes.io/job-completion-index": str(completion),
    }


KINDS = {
    "JobSet": (JOBSET, jobset),
    "RayJob": (RAYJOB, rayjob),
    "TrainJob": (TRAINJOB, trainjob),
}


def events(world: World, kind: str) -> list[tuple[str, str]]:
    return [
        (e["reason"], e["message"])
        for e in world.fake.list_objects("events", world.namespace, {})["items"]
        if e["involvedObject"]["kind"] == kind
    ]


def job_of(kind: str) -> Job:
    return Job.objects.get(spec__workload__kind=kind)


@pytest.mark.parametrize("kind", list(KINDS))
def test_an_object_is_queued_admitted_its_pods_bound_run_and_ended(world: World, kind: str) -> None:
    """Two 8-GPU pods of one object (a JobSet's two Jobs, a RayJob's head and worker, a
    TrainJob's two nodes): one gang of 2 x 8 GPUs, unsuspended once placed, its
    controller's pods bound one per node, running, then ended as the object ended."""
    resumable, build = KINDS[kind]
    operator = Operator(world, resumable)
    operator.create(build("train"))
    world.controller.sync()
    job = job_of(kind)
    assert (job.replicas, job.gpus_per_replica, job.state) == (2, 8, "queued")
    assert [r for r, _ in events(world, kind)] == ["Queued"]
    assert operator.get("train")["spec"]["suspend"] is True
    world.step()  # placed: labelled and unsuspended
    assert operator.get("train")["spec"]["suspend"] is False
    names = operator.step("train")
    world.step()  # adopted and bound
    nodes = {n: world.pod(n)["spec"].get("nodeName") for n in names}
    assert sorted(nodes.values()) == ["k8s-gpu-1", "k8s-gpu-2"], nodes
    allocs = {a.pod_name: a.node.name for a in Allocation.objects.filter(job=job)}
    assert allocs == nodes
    for name in names:
        world.fake.run_container(world.namespace, name)
    world.step()
    job.refresh_from_db()
    assert job.state == "running"
    world.controller.sync()  # tells it is running
    _end(world, operator, "train", names)
    world.step()
    world.step()
    job.refresh_from_db()
    assert job.state == "succeeded", job.reason
    reasons = sorted(r for r, _ in events(world, kind))
    assert reasons == ["Admitted", "Queued", "Running", "Succeeded"]


def _end(world: World, operator: Operator, name: str, pods: list[str]) -> None:
    """The object's end as its controller writes it: a RayJob's job ends while its cluster's
    pods run on (KubeRay marks the RayJob Complete); a JobSet's or TrainJob's pods exit."""
    obj = operator.get(name)
    if operator.kind is RAYJOB:
        obj["status"] = {"jobDeploymentStatus": "Complete", "jobStatus": "SUCCEEDED"}
        world.fake.replace(operator.kind.plural, world.namespace, name, obj)
        return
    for pod in pods:
        world.fake.set_pod_status(world.namespace, pod, {"phase": "Succeeded"})
    complete = "Completed" if operator.kind is JOBSET else "Complete"
    obj["status"] = {"conditions": [{"type": complete, "status": "True"}]}
    world.fake.replace(operator.kind.plural, world.namespace, name, obj)


def test_a_jobsets_pods_are_each_replica_by_their_job_and_completion_index(world: World) -> None:
    """Two Jobs of two pods: pod (job j, index c) is replica 2j + c, whatever their names."""
    operator = Operator(world, JOBSET)
    operator.create(jobset("ddp", gpus=4, jobs=2, parallelism=2))
    world.step()
    job = job_of("JobSet")
    names = operator.step("ddp")
    world.step()
    replicas = {a.pod_name: a.replica for a in Allocation.objects.filter(job=job)}
    assert replicas == {
        "ddp-w-0-0-x": 0,
        "ddp-w-0-1-x": 1,
        "ddp-w-1-0-x": 2,
        "ddp-w-1-1-x": 3,
    }
    labels = operator.get("ddp")["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]
    assert labels["metadata"]["labels"]["gantry.io/replica-stride"] == "2"
    assert all(world.pod(n)["spec"].get("nodeName") for n in names)


@pytest.mark.parametrize("kind", list(KINDS))
def test_a_preempted_object_is_suspended_and_admitted_again(world: World, kind: str) -> None:
    resumable, build = KINDS[kind]
    operator = Operator(world, resumable)
    operator.create(build("low", **{"gantry.io/priority-class": "low"}))
    world.step()
    low = job_of(kind)
    high = preempt_running(world, low, operator.step)
    assert operator.get("low")["spec"]["suspend"] is True
    world.controller.sync()
    assert "Preempted" in [r for r, _ in events(world, kind)]
    cancel_and_readmit(world, high, operator.step)
    assert operator.get("low")["spec"]["suspend"] is False
    bound = Allocation.objects.filter(job=low, attempt=1, bound_at__isnull=False)
    assert bound.count() == 2
    assert all(world.pod(a.pod_name)["spec"].get("nodeName") == a.node.name for a in bound)


@pytest.mark.parametrize("kind", list(KINDS))
def test_a_deleted_object_cancels_its_job(world: World, kind: str) -> None:
    resumable, build = KINDS[kind]
    Operator(world, resumable).create(build("gone"))
    world.controller.sync()
    world.fake.delete(resumable.plural, world.namespace, "gone", 0)
    world.controller.sync()
    cancelled = job_of(kind)
    assert cancelled.state == "cancelled"
    assert f"{kind} gone was deleted in Kubernetes" in cancelled.events.last().message


@pytest.mark.parametrize("kind", ["JobSet", "TrainJob"])
def test_an_object_that_completed_while_queued_again_ends(world: World, kind: str) -> None:
    resumable, build = KINDS[kind]
    operator = Operator(world, resumable)
    operator.create(build("done"))
    world.controller.sync()
    _end(world, operator, "done", [])
    world.controller.sync()
    queued = job_of(kind)
    assert queued.state == "cancelled"
    assert f"its {kind} is complete in Kubernetes" in queued.events.last().message


def test_a_failed_rayjob_fails_its_running_job(world: World) -> None:
    operator = Operator(world, RAYJOB)
    operator.create(rayjob("bad"))
    world.step()
    for name in operator.step("bad"):
        world.fake.run_container(world.namespace, name)
    world.step()
    world.step()
    job = job_of("RayJob")
    assert job.state == "running"
    obj = operator.get("bad")
    obj["status"] = {"jobDeploymentStatus": "Failed", "jobStatus": "FAILED"}
    world.fake.replace("rayjobs", world.namespace, "bad", obj)
    world.controller.sync()
    job.refresh_from_db()
    assert (job.state, job.reason) == ("failed", "its RayJob failed in Kubernetes")


@pytest.mark.parametrize(
    ("kind", "body", "why"),
    [
        ("JobSet", "uneven", "replicated job 'a' 8, replicated job 'b' 4"),
        ("RayJob", "uneven", "the head 8, worker group 'gpu' 8, worker group 'half' 4"),
        # 9 CPU workers and KubeRay's default submitter beside the GPU pods: over 8
        ("RayJob", "cpu-workers", "10 pods without GPUs beside its GPU pods"),
        # KubeRay's default: the cluster outlives its job, holding GPUs the queue took back
        ("RayJob", "keeps-cluster", "set spec.shutdownAfterJobFinishes: true"),
        ("TrainJob", "no-resources", "spec.trainer.resourcesPerNode"),
    ],
)
def test_what_cannot_be_one_job_is_refused_saying_why(
    world: World, kind: str, body: str, why: str
) -> None:
    resumable, build = KINDS[kind]
    obj = build(body)
    if kind == "JobSet":
        second = copy.deepcopy(obj["spec"]["replicatedJobs"][0])
        second["name"] = "b"
        second["template"]["spec"]["template"] = {"spec": pod_spec(4)}
        obj["spec"]["replicatedJobs"][0]["name"] = "a"
        obj["spec"]["replicatedJobs"].append(second)
    elif body == "keeps-cluster":
        del obj["spec"]["shutdownAfterJobFinishes"]
    elif kind == "RayJob":
        gpus = 4 if body == "uneven" else 0
        group = {"groupName": "half", "replicas": 9, "template": {"spec": pod_spec(gpus)}}
        obj["spec"]["rayClusterSpec"]["workerGroupSpecs"].append(group)
    else:
        del obj["spec"]["trainer"]["resourcesPerNode"]
    Operator(world, resumable).create(obj)
    world.controller.sync()
    world.controller.sync()
    assert not Job.objects.exists()
    (told,) = events(world, kind)  # once, not every pass
    assert told[0] == "Refused" and why in told[1], told


# -- LeaderWorkerSet ----------------------------------------------------------------------


class LwsController:
    """Plays LWS's controllers on the fake: each group's leader and worker pods, made by its
    StatefulSets (so gated by Gantry's webhook like a user's pod, their annotation naming the
    StatefulSet controller), labelled with the set and group index."""

    def __init__(self, world: World) -> None:
        self.world = world

    def create(self, name: str, replicas: int, size: int, gpus: int = 4, priority: str = "") -> Obj:
        labels = {"gantry.io/priority-class": priority} if priority else {}
        template = {"metadata": {"labels": labels}, "spec": pod_spec(gpus)}
        spec = {
            "replicas": replicas,
            "leaderWorkerTemplate": {
                "size": size,
                "leaderTemplate": template,
                "workerTemplate": template,
            },
        }
        body = _obj(LEADERWORKERSET, name, spec, {})
        held = jsonpatch.apply_patch(copy.deepcopy(body), plan(LEADERWORKERSET, body, "alice"))
        return self.world.fake.create("leaderworkersets", self.world.namespace, held)

    def make(self, name: str, group: int, workers: range) -> None:
        obj = self.world.fake.get("leaderworkersets", self.world.namespace, name)
        assert obj is not None
        template = obj["spec"]["leaderWorkerTemplate"]
        for worker in workers:
            pod_name = f"{name}-{group}" if worker == 0 else f"{name}-{group}-{worker}"
            labels = {
                "leaderworkerset.sigs.k8s.io/name": name,
                "leaderworkerset.sigs.k8s.io/group-index": str(group),
                "leaderworkerset.sigs.k8s.io/worker-index": str(worker),
            }
            chosen = template["leaderTemplate" if worker == 0 else "workerTemplate"]
            labels |= chosen.get("metadata", {}).get("labels", {})
            spec = chosen["spec"]
            owner = {
                "apiVersion": "apps/v1",
                "kind": "StatefulSet",
                "name": name,
                "uid": "u",
                "controller": True,
            }
            body = {
                "metadata": {"name": pod_name, "labels": labels, "ownerReferences": [owner]},
                "spec": copy.deepcopy(spec),
            }
            user = "system:serviceaccount:kube-system:statefulset-controller"
            held = jsonpatch.apply_patch(copy.deepcopy(body), plan(POD, body, user))
            self.world.fake.create("pods", self.world.namespace, held)


def test_each_lws_group_is_a_gang_admitted_by_removing_its_gates(world: World) -> None:
    """Two groups of 2 x 4 GPUs: each is queued once all its pods exist, as the set's user,
    and admitted whole (gates removed, bound); a group scaled away cancels its job."""
    lws = LwsController(world)
    lws.create("serve", replicas=2, size=2)
    lws.make("serve", 0, range(1))  # the leader first: its group is not complete
    world.controller.sync()
    assert not Job.objects.exists()
    lws.make("serve", 0, range(1, 2))
    lws.make("serve", 1, range(2))
    world.controller.sync()
    jobs = list(Job.objects.order_by("id"))
    assert [(j.replicas, j.gpus_per_replica, j.submitted_by.username) for j in jobs] == [
        (2, 4, "alice")
    ] * 2
    assert [j.spec["workload"]["pods"] for j in jobs] == [
        ["serve-0", "serve-0-1"],
        ["serve-1", "serve-1-1"],
    ]
    assert {j.spec["workload"]["kind"] for j in jobs} == {"LeaderWorkerSet"}
    assert "Queued" in [r for r, _ in world.events("serve-0")]
    world.step()
    for name in ("serve-0", "serve-0-1", "serve-1", "serve-1-1"):
        pod = world.pod(name)
        assert pod["spec"].get("nodeName") and GATE not in str(pod["spec"].get("schedulingGates"))
    world.fake.delete("pods", world.namespace, "serve-1", 0)  # scaled down: group 1 goes
    world.fake.delete("pods", world.namespace, "serve-1-1", 0)
    world.controller.sync()
    jobs[1].refresh_from_db()
    assert jobs[1].state == "cancelled"
    jobs[0].refresh_from_db()
    assert jobs[0].state in ("binding", "running")


def test_a_deleted_lws_cancels_its_groups_jobs(world: World) -> None:
    lws = LwsController(world)
    lws.create("gone", replicas=1, size=2)
    lws.make("gone", 0, range(2))
    world.controller.sync()
    world.fake.delete("leaderworkersets", world.namespace, "gone", 0)  # its pods go with it
    world.controller.sync()
    assert Job.objects.get().state == "cancelled"


def test_the_api_and_portal_mark_each_kind(world: World) -> None:
    from django.test import Client
    from rest_framework.test import APIClient

    Operator(world, JOBSET).create(jobset("marked"))
    world.controller.sync()
    api = APIClient()
    api.force_authenticate(world.org.users["alice"])
    (listed,) = api.get("/api/v1/jobs/", {"origin": "kubernetes"}).json()["results"]
    assert (listed["origin"]["kind"], listed["origin"]["api_version"]) == (
        "JobSet",
        "jobset.x-k8s.io/v1alpha2",
    )
    browser = Client()
    browser.force_login(world.org.users["alice"])
    assert "k8s JobSet" in browser.get("/jobs/").content.decode()
    page = browser.get(f"/jobs/{job_of('JobSet').pk}/").content.decode()
    assert "Kubernetes: JobSet" in page and f"{world.namespace}/marked" in page


def test_an_lws_group_made_again_is_a_new_job_and_its_old_one_ends(world: World) -> None:
    """A group's pods deleted (preempted: a gate cannot come back) and made again under the
    same names by its StatefulSets: new pods (new uids), so the old job is cancelled and the
    group is queued anew, never admitted through the old job."""
    lws = LwsController(world)
    lws.create("again", replicas=1, size=2)
    lws.make("again", 0, range(2))
    world.step()
    first = Job.objects.get()
    for name in ("again-0", "again-0-1"):
        world.fake.delete("pods", world.namespace, name, 0)
    lws.make("again", 0, range(2))
    world.controller.sync()
    first.refresh_from_db()
    assert first.state == "cancelled"
    assert "pod again-0 was deleted in Kubernetes" in first.events.last().message
    second = Job.objects.exclude(pk=first.pk).get()
    assert second.state == "queued"
    assert second.spec["workload"]["uids"] == [
        world.pod(n)["metadata"]["uid"] for n in ("again-0", "again-0-1")
    ]


def test_a_preempted_lws_group_is_deleted_and_queued_again_as_made_anew(world: World) -> None:
    """A low-priority group holds both nodes; a high-priority job preempts it: its pods are
    deleted (a gate cannot come back), its job ends cancelled, and the pods its StatefulSets
    make again, gated, are a new job that waits its turn."""
    lws = LwsController(world)
    lws.create("low", replicas=1, size=2, gpus=8, priority="low")
    lws.make("low", 0, range(2))
    world.step()
    group = Job.objects.get()
    for name in ("low-0", "low-0-1"):
        world.fake.run_container(world.namespace, name)
    world.step()
    world.step()
    group.refresh_from_db()
    assert group.state == "running", group.reason
    world.step(400.0)  # past the minimum runtime before a job may be preempted
    spec = job_spec(replicas=1, resources={"gpus": 8}, priority_class="high", max_runtime_s=60)
    job_submit(user=world.org.users["alice"], project=world.org.proj_alpha, payload=spec)
    for _ in range(3):
        world.step()
        for name in ("low-0", "low-0-1"):  # the kubelet ends what Gantry deleted
            pod = world.pod(name)
            if pod is not None and pod["metadata"].get("deletionTimestamp"):
                world.fake.finalize_pod(world.namespace, name)
    assert world.pod("low-0") is None and world.pod("low-0-1") is None
    lws.make("low", 0, range(2))  # its StatefulSets make the pods again
    world.controller.sync()
    group.refresh_from_db()
    assert group.state == "cancelled"
    again = Job.objects.exclude(pk=group.pk).get(spec__workload__kind="LeaderWorkerSet")
    assert again.state == "queued"
    gates = [g["name"] for g in world.pod("low-0")["spec"]["schedulingGates"]]
    assert gates == [GATE]


def test_pods_made_again_are_never_admitted_through_the_old_job(world: World) -> None:
    """The group's pods deleted and made again (new uids) before the controller's next pass:
    the daemon places the old job, but the pods under those names are not its own, so it
    admits none of them; they stay gated until their own job is queued."""
    lws = LwsController(world)
    lws.create("race", replicas=1, size=2)
    lws.make("race", 0, range(2))
    world.controller.sync()
    old = Job.objects.get()
    for name in ("race-0", "race-0-1"):
        world.fake.delete("pods", world.namespace, name, 0)
    lws.make("race", 0, range(2))
    world.clock.advance(1.0)
    world.daemon.step()  # no controller pass between: the old job is placed
    for name in ("race-0", "race-0-1"):
        pod = world.pod(name)
        assert [g["name"] for g in pod["spec"]["schedulingGates"]] == [GATE]
        assert not pod["spec"].get("nodeName")
    world.controller.sync()
    old.refresh_from_db()
    assert old.state == "cancelled"
    new = Job.objects.exclude(pk=old.pk).get()
    world.step()
    world.step()
    assert all(world.pod(n)["spec"].get("nodeName") for n in ("race-0", "race-0-1"))
    assert set(Allocation.objects.filter(job=new).values_list("pod_name", flat=True)) == {
        "race-0",
        "race-0-1",
    }
