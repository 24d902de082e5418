"""The pods an operator makes beside a job's replicas are bound by Gantry (issue 37), over the
fake API server: a RayJob's submitter (the pod of the Job KubeRay makes from
`spec.submitterPodTemplate`) and a TrainJob's initializers (the pods of its JobSet's
initializer Jobs) go to the node of replica 0, where their CPU and memory were reserved
(tests/workloads/test_companions.py), are not taken as replicas nor deleted as orphans while
their attempt is admitted, and are never bound for an attempt that is not (a stale attempt's,
a queued job's): scheduler/daemon/companions/binding.py.

The tests play the operators: the webhook holds what the user creates (`Operator.create`),
Gantry's admission labels the templates, and the test makes the pods the operator's Job
would, through the webhook's plan for an owned pod (its schedulerName only)."""

from __future__ import annotations

import copy
from typing import Any

import jsonpatch
import pytest

from scheduler.backends.kubernetes.resume import resume_patch
from scheduler.backends.kubernetes.status import pod_status
from scheduler.backends.workloads import RAYJOB as RESUMABLE_RAYJOB
from scheduler.models import Allocation, Job
from scheduler.workloads.kinds import JOBSET, POD, RAYJOB, TRAINJOB
from scheduler.workloads.mutate import plan
from tests.k8s.builders import make_request
from tests.workloads.test_companions import head_only, occupy_two_cpus, runtime, small
from tests.workloads.test_controller import World, cancel_and_readmit, preempt_running, world
from tests.workloads.test_kinds_queued import (
    IMAGE,
    Operator,
    jobset,
    pod_spec,
    rayjob,
    trainjob,
)
from tests.workloads.test_pytorchjob import TrainingOperator, pytorchjob
from tests.workloads.test_shape_kinds import pod, rayjob_with

__all__ = ["small", "world"]  # the fixtures, for this module
Obj = dict[str, Any]
KUBERAY = "system:serviceaccount:ray-system:kuberay-operator"
JOB_CONTROLLER = "system:serviceaccount:kube-system:job-controller"


def job_pod(world: World, name: str, template: Obj, job: str, **labels: str) -> Obj:
    """The pod a Job's controller makes from `template` (its labels, the Job controller's),
    owned by the Job `job`, as the webhook leaves a pod owned by a held kind's child."""
    meta = template.get("metadata") or {}
    owner = {"apiVersion": "batch/v1", "kind": "Job", "name": job, "uid": f"uid-{job}"}
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "labels": {
                **(meta.get("labels") or {}),
                "batch.kubernetes.io/job-name": job,
                "batch.kubernetes.io/controller-uid": f"uid-{job}",
                **labels,
            },
            "ownerReferences": [{**owner, "controller": True}],
        },
        "spec": copy.deepcopy(template["spec"]),
    }
    held = jsonpatch.apply_patch(pod, plan(POD, pod, JOB_CONTROLLER))
    return world.fake.create("pods", world.namespace, held)


def submitter(world: World, rayjob: Obj, name: str) -> Obj:
    """The pod of the submitter Job KubeRay makes (named as the RayJob) from the RayJob's
    `submitterPodTemplate` as it stands in `rayjob`."""
    template = rayjob["spec"]["submitterPodTemplate"]
    return job_pod(world, name, template, rayjob["metadata"]["name"])


def low_priority(body: Obj) -> Obj:
    body["metadata"]["labels"]["gantry.io/priority-class"] = "low"
    return body


def node_of(world: World, name: str) -> str | None:
    pod = world.pod(name)
    assert pod is not None, name
    return pod["spec"].get("nodeName")


def head_node(job: Job) -> str:
    """The node of replica 0 of the job's current attempt."""
    job.refresh_from_db()
    alloc = Allocation.objects.get(job=job, attempt=job.attempt, replica=0, ended_at__isnull=True)
    return alloc.node.name


def test_the_webhook_writes_kuberays_default_submitter_where_a_rayjob_gives_none(
    world: World,
) -> None:
    """A RayJob in K8sJobMode without a submitter template: held with KubeRay's default one
    (the head's image, 500m / 200Mi, Gantry's scheduler), which Gantry's admission labels;
    one with a template of its own keeps it; in HTTPMode none is written."""
    operator = Operator(world, RAYJOB)
    held = operator.create(rayjob("ray"))
    template = held["spec"]["submitterPodTemplate"]
    (container,) = template["spec"]["containers"]
    assert (
        container["image"]
        == held["spec"]["rayClusterSpec"]["headGroupSpec"]["template"]["spec"]["containers"][0][
            "image"
        ]
    )
    assert container["resources"]["requests"] == {"cpu": "500m", "memory": "200Mi"}
    assert template["spec"]["schedulerName"] == "gantry"
    assert template["spec"]["restartPolicy"] == "Never"
    own = {"spec": {"restartPolicy": "Never", "containers": [{"name": "s", "image": IMAGE}]}}
    body = rayjob("mine")
    body["spec"]["submitterPodTemplate"] = own
    mine = operator.create(body)
    assert mine["spec"]["submitterPodTemplate"]["spec"]["containers"] == own["spec"]["containers"]
    http = rayjob("http")
    http["spec"]["submissionMode"] = "HTTPMode"
    assert "submitterPodTemplate" not in operator.create(http)["spec"]


def test_the_submitter_of_an_admitted_rayjob_is_bound_to_its_heads_node(world: World) -> None:
    """Admitted, the RayJob's submitter template carries the job, the attempt and the
    companion label; the submitter pod KubeRay's Job makes from it is bound to the node of
    replica 0 (the head's), is no replica (the head and worker pods still take theirs), and
    is kept while the job runs."""
    operator = Operator(world, RAYJOB)
    operator.create(rayjob("ray"))
    world.step()
    job = Job.objects.get(spec__workload__kind="RayJob")
    admitted = operator.get("ray")
    assert admitted["spec"]["suspend"] is False
    labels = admitted["spec"]["submitterPodTemplate"]["metadata"]["labels"]
    assert labels["gantry.io/job-id"] == str(job.pk)
    assert (labels["gantry.io/attempt"], labels["gantry.io/companion"]) == ("0", "submitter")
    submitter(world, admitted, "ray-submitter-x")
    cluster = operator.step("ray")
    world.step()
    assert node_of(world, "ray-submitter-x") == head_node(job)
    names = {a.pod_name for a in Allocation.objects.filter(job=job, ended_at__isnull=True)}
    assert names == set(cluster)  # the head and the worker are the replicas; not the submitter
    assert all(node_of(world, n) for n in cluster)
    for name in cluster:
        world.fake.run_container(world.namespace, name)
    world.fake.run_container(world.namespace, "ray-submitter-x")
    world.step()
    world.step()
    job.refresh_from_db()
    assert job.state == "running", job.reason
    assert world.pod("ray-submitter-x") is not None  # kept: not an orphan


def test_a_preempted_rayjobs_submitter_is_never_bound_for_a_stale_attempt(world: World) -> None:
    """Preempted, the RayJob's submitter pod goes with its attempt (deleted as the orphan it
    is); a submitter KubeRay's Job makes again from the old template (attempt 0) is not bound,
    neither while the RayJob waits nor once it is admitted again; the new attempt's (from the
    template relabelled with attempt 1) is bound to the new head's node."""
    operator = Operator(world, RAYJOB)
    operator.create(low_priority(rayjob("low")))
    world.step()
    low = Job.objects.get(spec__workload__kind="RayJob")
    first = operator.get("low")
    submitter(world, first, "low-submitter-a")
    high = preempt_running(world, low, operator.step)
    assert world.pod("low-submitter-a") is None  # went with its attempt
    submitter(world, first, "low-submitter-b")  # the old Job, not yet torn down
    world.step()
    assert world.pod("low-submitter-b") is None  # an orphan: deleted, never bound
    cancel_and_readmit(world, high, operator.step)
    low.refresh_from_db()
    assert (low.state, low.attempt) in (("admitted", 1), ("binding", 1)), low.reason
    again = operator.get("low")
    assert again["spec"]["submitterPodTemplate"]["metadata"]["labels"]["gantry.io/attempt"] == "1"
    submitter(world, first, "low-submitter-c")  # the old template's, once more
    submitter(world, again, "low-submitter-d")
    world.step()
    stale = world.pod("low-submitter-c")
    assert stale is None or not stale["spec"].get("nodeName")
    assert node_of(world, "low-submitter-d") == head_node(low)


def test_a_submitter_of_a_rayjob_not_admitted_stays_unbound(small: World) -> None:
    """Two RayJobs: one admitted, whose submitter is bound; one waiting for room (a head of 8
    GPUs beside a job holding one), whose submitter pod (its labels as an admission would
    have left them) stays unbound: its job holds no node to go to."""
    occupy_two_cpus(small)
    operator = Operator(small, RAYJOB)
    operator.create(head_only("fits", gpus=6, cpu="2"))
    operator.create(head_only("waits", gpus=8, cpu="2"))
    small.step()
    small.step()
    fits = Job.objects.get(spec__workload__name="fits")
    waits = Job.objects.get(spec__workload__name="waits")
    assert waits.state == "queued", waits.reason
    template = copy.deepcopy(operator.get("waits")["spec"]["submitterPodTemplate"])
    template["metadata"] = {
        "labels": {
            "app.kubernetes.io/managed-by": "gantry",
            "gantry.io/job-id": str(waits.pk),
            "gantry.io/attempt": "0",
            "gantry.io/companion": "submitter",
        }
    }
    job_pod(small, "waits-submitter-x", template, "waits")
    submitter(small, operator.get("fits"), "fits-submitter-x")
    small.step()
    assert node_of(small, "fits-submitter-x") == head_node(fits)
    stale = small.pod("waits-submitter-x")
    assert stale is None or not stale["spec"].get("nodeName")


def initializer(world: World, trainjob: str, name: str, patch_labels: Obj) -> Obj:
    """The pod of the Trainer's JobSet's initializer Job `name` (its template merged with
    Gantry's runtime patch, as the Trainer merges it), with JobSet's labels."""
    container = {"name": name, "image": IMAGE}
    template: Obj = {"metadata": {"labels": patch_labels}, "spec": {"containers": [container]}}
    return job_pod(
        world,
        f"{trainjob}-{name}-0-0-x",
        template,
        f"{trainjob}-{name}-0",
        **{
            "jobset.sigs.k8s.io/jobset-name": trainjob,
            "jobset.sigs.k8s.io/replicatedjob-name": name,
            "jobset.sigs.k8s.io/job-index": "0",
            "batch.kubernetes.io/job-completion-index": "0",
        },
    )


def patch_labels(obj: Obj, job: str) -> Obj:
    (patch,) = [p for p in obj["spec"]["runtimePatches"] if p["manager"] == "gantry.io/scheduler"]
    jobs = patch["trainingRuntimeSpec"]["template"]["spec"]["replicatedJobs"]
    (found,) = [j for j in jobs if j["name"] == job]
    labels: Obj = found["template"]["spec"]["template"]["metadata"]["labels"]
    return labels


def test_a_trainjobs_initializers_are_bound_to_its_first_nodes_node(world: World) -> None:
    """Admitted, the TrainJob's runtime patch labels its initializers' pods as companions; the
    Trainer's initializer Jobs run first (the nodes depend on them): their pods are bound to
    the first node's node, taken as no replica, and kept once they have completed."""
    world.fake.create(
        "clustertrainingruntimes", "", runtime("ClusterTrainingRuntime", "torch", "3")
    )
    operator = Operator(world, TRAINJOB)
    operator.create(trainjob("t"))
    world.step()
    job = Job.objects.get(spec__workload__kind="TrainJob")
    admitted = operator.get("t")
    assert admitted["spec"]["suspend"] is False
    labels = patch_labels(admitted, "model-initializer")
    assert labels["gantry.io/companion"] == "model-initializer"
    pod = initializer(world, "t", "model-initializer", labels)
    world.step()
    name = pod["metadata"]["name"]
    assert node_of(world, name) == head_node(job)
    job.refresh_from_db()
    assert job.state in ("admitted", "binding"), job.reason  # not taken as replica 0's pod
    assert all(
        a.pod_name != name for a in Allocation.objects.filter(job=job, ended_at__isnull=True)
    )
    world.fake.run_container(world.namespace, name)
    world.step()
    assert world.pod(name) is not None  # kept while its attempt is admitted


def test_a_trainjobs_initializer_is_not_bound_once_it_is_preempted(world: World) -> None:
    """Preempted, the TrainJob's initializer pods are not bound (its job, queued again, holds
    no node): one its initializer Job makes again meanwhile is deleted as an orphan, never
    bound."""
    world.fake.create(
        "clustertrainingruntimes", "", runtime("ClusterTrainingRuntime", "torch", "3")
    )
    operator = Operator(world, TRAINJOB)
    operator.create(low_priority(trainjob("low")))
    world.step()
    low = Job.objects.get(spec__workload__kind="TrainJob")
    labels = patch_labels(operator.get("low"), "dataset-initializer")
    preempt_running(world, low, operator.step)
    pod = initializer(world, "low", "dataset-initializer", labels)
    world.step()
    again = world.pod(pod["metadata"]["name"])
    assert again is None or not again["spec"].get("nodeName")


def test_a_rayjobs_submitter_template_names_the_attempt_at_each_admission() -> None:
    """Attempt 0 labels the submitter template as the head's, with the companion label;
    attempt 1 replaces its attempt too; in HTTPMode (no submitter pod) it is not touched."""
    obj = rayjob_with(pod(8), pod(8), suspend=True, submitterPodTemplate={"spec": pod(0)})
    first = jsonpatch.apply_patch(obj, resume_patch(RESUMABLE_RAYJOB, obj, make_request(job_id=5)))
    labels = first["spec"]["submitterPodTemplate"]["metadata"]["labels"]
    assert (labels["gantry.io/job-id"], labels["gantry.io/attempt"]) == ("5", "0")
    assert labels["gantry.io/companion"] == "submitter"
    assert first["spec"]["submitterPodTemplate"]["spec"] == pod(0)  # what it runs: the user's
    first["spec"]["suspend"] = True
    again = resume_patch(RESUMABLE_RAYJOB, first, make_request(job_id=5, attempt=1))
    attempt = "/spec/submitterPodTemplate/metadata/labels/gantry.io~1attempt"
    assert {"op": "add", "path": attempt, "value": "1"} in again
    http = rayjob_with(pod(8), pod(8), submissionMode="HTTPMode", submitterPodTemplate={})
    ops = resume_patch(RESUMABLE_RAYJOB, http, make_request(job_id=5))
    assert not [op for op in ops if op["path"].startswith("/spec/submitterPodTemplate")]


@pytest.mark.parametrize(
    ("labels", "replica", "companion"),
    [
        # an initializer's pod: JobSet's job index and the Job's completion index, yet no
        # replica of its own: replica 0's companion
        (
            {
                "gantry.io/companion": "dataset-initializer",
                "jobset.sigs.k8s.io/job-index": "0",
                "batch.kubernetes.io/job-completion-index": "3",
            },
            0,
            "dataset-initializer",
        ),
        # a TrainJob's node pod: its completion index is its replica
        (
            {
                "jobset.sigs.k8s.io/job-index": "0",
                "batch.kubernetes.io/job-completion-index": "1",
            },
            1,
            "",
        ),
    ],
    ids=["initializer", "node"],
)
def test_a_companion_pod_is_read_as_replica_0s(labels: Obj, replica: int, companion: str) -> None:
    pod = {
        "metadata": {
            "name": "p",
            "namespace": "ns",
            "labels": {"gantry.io/job-id": "4", "batch.kubernetes.io/job-name": "t-x-0", **labels},
        },
        "spec": {},
        "status": {"phase": "Pending"},
    }
    status = pod_status(pod)
    assert status is not None
    assert (status.job_id, status.attempt, status.replica) == (4, -1, replica)
    assert status.companion == companion


# -- parts without GPUs beside GPU parts: a RayJob's CPU head, a PyTorchJob's CPU Master -----


def cpu_head_rayjob(name: str, workers: int = 2) -> Obj:
    """A RayJob as nearly every RayJob is: a head without GPUs beside GPU workers."""
    body = rayjob(name, gpus=8, workers=workers)
    body["spec"]["rayClusterSpec"]["headGroupSpec"]["template"] = {"spec": pod_spec(0)}
    return body


def test_a_rayjobs_cpu_head_is_bound_beside_replica_0_and_its_gpu_workers_are_the_replicas(
    world: World,
) -> None:
    """Two 8-GPU workers are the replicas (2 x 8 GPUs, replica 0 the first worker, with the
    head's and the submitter's CPU and memory); KubeRay's head pod, labelled a companion by
    the admission, is bound to replica 0's node, never adopted, and kept while the job runs;
    each worker is bound to its own replica's node."""
    operator = Operator(world, RAYJOB)
    operator.create(cpu_head_rayjob("ray"))
    world.step()
    job = Job.objects.get(spec__workload__kind="RayJob")
    # per replica: the worker's 2 CPUs, 8 GiB; on replica 0 also the head's 2 CPUs, 8 GiB
    # and KubeRay's default submitter's 500m, 200Mi (every replica reserves as much)
    assert (job.replicas, job.gpus_per_replica, job.cpu_milli, job.memory_mib) == (
        2,
        8,
        4500,
        16584,
    )
    admitted = operator.get("ray")
    head = admitted["spec"]["rayClusterSpec"]["headGroupSpec"]["template"]["metadata"]
    assert (head["labels"]["gantry.io/companion"], head["labels"]["gantry.io/attempt"]) == (
        "head",
        "0",
    )
    made = operator.step("ray")
    assert made == ["ray-gpu-worker-0", "ray-gpu-worker-1", "ray-head-x"]
    world.step()
    allocs = {
        a.pod_name: (a.replica, a.node.name)
        for a in Allocation.objects.filter(job=job, ended_at__isnull=True)
    }
    assert {n: r for n, (r, _) in allocs.items()} == {"ray-gpu-worker-0": 0, "ray-gpu-worker-1": 1}
    assert {n: node_of(world, n) for n in allocs} == {n: node for n, (_, node) in allocs.items()}
    assert node_of(world, "ray-head-x") == head_node(job) == allocs["ray-gpu-worker-0"][1]
    for name in made:
        world.fake.run_container(world.namespace, name)
    world.step()
    world.step()
    job.refresh_from_db()
    assert job.state == "running", job.reason
    assert world.pod("ray-head-x") is not None  # kept: not an orphan


def test_a_preempted_rayjobs_cpu_head_is_not_bound_for_a_stale_attempt(world: World) -> None:
    """Preempted and admitted again, a head KubeRay makes again from the old cluster's
    template (attempt 0) is not bound; the new attempt's head is bound to the new replica
    0's node."""
    operator = Operator(world, RAYJOB)
    operator.create(low_priority(cpu_head_rayjob("low")))
    world.step()
    low = Job.objects.get(spec__workload__kind="RayJob")
    first = operator.get("low")["spec"]["rayClusterSpec"]["headGroupSpec"]["template"]
    high = preempt_running(world, low, operator.step)
    cancel_and_readmit(world, high, operator.step)
    low.refresh_from_db()
    assert low.attempt == 1 and low.state in ("binding", "running"), low.reason
    assert node_of(world, "low-head-x") == head_node(low)  # the new cluster's head
    stale = {"metadata": {"name": "low-head-old", "labels": {**first["metadata"]["labels"]}}}
    stale["metadata"]["labels"]["ray.io/node-type"] = "head"
    world.fake.create("pods", world.namespace, {**stale, "spec": copy.deepcopy(first["spec"])})
    world.step()
    old = world.pod("low-head-old")
    assert old is None or not old["spec"].get("nodeName")


def test_a_pytorchjobs_cpu_master_is_bound_beside_worker_0_and_left_to_finish(
    world: World,
) -> None:
    """A Master without GPUs beside two 8-GPU Workers: the Workers are replicas 0 and 1, the
    Master is bound to replica 0's node; once the Workers succeed, the job has succeeded and
    the Master, still running (the PyTorchJob succeeds when its Master does), is left to
    finish, not deleted."""
    operator = TrainingOperator(world)
    operator.create(pytorchjob("pt", gpus=8, workers=2, master_gpus=0))
    world.step()
    job = Job.objects.get(spec__workload__kind="PyTorchJob")
    assert (job.replicas, job.gpus_per_replica) == (2, 8)
    made = operator.step("pt")
    world.step()
    allocs = {
        a.pod_name: a.replica for a in Allocation.objects.filter(job=job, ended_at__isnull=True)
    }
    assert allocs == {"pt-worker-0": 0, "pt-worker-1": 1}
    assert node_of(world, "pt-master-0") == head_node(job)
    for name in made:
        world.fake.run_container(world.namespace, name)
    world.step()
    world.step()
    job.refresh_from_db()
    assert job.state == "running", job.reason
    for name in ("pt-worker-0", "pt-worker-1"):
        world.fake.set_pod_status(world.namespace, name, {"phase": "Succeeded"})
    world.step()
    world.step()
    job.refresh_from_db()
    assert job.state == "succeeded", job.reason
    master = world.pod("pt-master-0")
    assert master is not None and not master["metadata"].get("deletionTimestamp")


def test_an_older_attempts_initializer_is_never_kept_nor_bound(world: World) -> None:
    """The TrainJob's initializers name the attempt (replaced at each admission, as a RayJob's
    templates): preempted and admitted again, a pod the old attempt's initializer Job makes
    (its labels naming attempt 0) is not bound (an orphan), while the new attempt's is bound
    to the new first node's node."""
    world.fake.create(
        "clustertrainingruntimes", "", runtime("ClusterTrainingRuntime", "torch", "3")
    )
    operator = Operator(world, TRAINJOB)
    operator.create(low_priority(trainjob("low")))
    world.step()
    low = Job.objects.get(spec__workload__kind="TrainJob")
    old = patch_labels(operator.get("low"), "dataset-initializer")
    assert old["gantry.io/attempt"] == "0"
    high = preempt_running(world, low, operator.step)
    cancel_and_readmit(world, high, operator.step)
    low.refresh_from_db()
    assert low.attempt == 1 and low.state in ("admitted", "binding", "running"), low.reason
    new = patch_labels(operator.get("low"), "model-initializer")
    assert new["gantry.io/attempt"] == "1"
    assert patch_labels(operator.get("low"), "dataset-initializer")["gantry.io/attempt"] == "1"
    stale = initializer(world, "low", "dataset-initializer", old)["metadata"]["name"]
    fresh = initializer(world, "low", "model-initializer", new)["metadata"]["name"]
    world.step()
    left = world.pod(stale)
    assert left is None or not left["spec"].get("nodeName")
    assert node_of(world, fresh) == head_node(low)


def jobset_with_driver(name: str) -> Obj:
    """Two Jobs of one 8-GPU pod each (`jobset`), and a driver Job of one pod without GPUs
    before them."""
    body = jobset(name)
    driver = copy.deepcopy(body["spec"]["replicatedJobs"][0])
    driver |= {"name": "driver", "replicas": 1}
    driver["template"]["spec"]["template"] = {"spec": pod_spec(0)}
    body["spec"]["replicatedJobs"].insert(0, driver)
    return body


def test_a_jobsets_driver_is_bound_beside_replica_0_and_its_gpu_jobs_are_the_replicas(
    world: World,
) -> None:
    """A JobSet of a driver (one pod without GPUs) and two Jobs of one 8-GPU pod: the GPU
    pods are replicas 0 and 1 (by the base and stride on their template), the driver's pod
    is bound to replica 0's node, never adopted, and left to finish once the job succeeds."""
    body = jobset_with_driver("js")
    operator = Operator(world, JOBSET)
    operator.create(body)
    world.step()
    job = Job.objects.get(spec__workload__kind="JobSet")
    assert (job.replicas, job.gpus_per_replica, job.cpu_milli) == (2, 8, 4000)
    made = operator.step("js")
    world.step()
    allocs = {
        a.pod_name: a.replica for a in Allocation.objects.filter(job=job, ended_at__isnull=True)
    }
    assert allocs == {"js-w-0-0-x": 0, "js-w-1-0-x": 1}
    assert node_of(world, "js-driver-0-0-x") == head_node(job)
    for name in made:
        world.fake.run_container(world.namespace, name)
    for name in allocs:
        world.fake.set_pod_status(world.namespace, name, {"phase": "Succeeded"})
    for _ in range(3):
        world.step()
    job.refresh_from_db()
    assert job.state == "succeeded", job.reason
    driver_pod = world.pod("js-driver-0-0-x")
    assert driver_pod is not None and not driver_pod["metadata"].get("deletionTimestamp")
