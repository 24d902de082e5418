"""A JobSet and a LeaderWorkerSet created with the client, as `kubectl apply` creates them, on the
real control plane with their real controller managers (issue 37): Gantry's webhook holds
them, the controller queues them as the user who created them, the daemon admits them (the
JobSet unsuspended, the LWS group's gates removed), their controllers' pods are bound where
Gantry placed them, and they run to their end. Skipped only where a manager is not built
(`python -m devcluster build --peers`), as tests/devcluster/test_jobset.py is.

RayJob, TrainJob and PyTorchJob have no operator built here (their CRDs are installed, their
managers are not): their tests play the operator. Once Gantry unsuspends the object, the test
creates the pods the operator would (owned by the object, with the labels the operator sets and the
templates' labels as Gantry left them) and checks that Gantry binds them; for a RayJob it also
writes the status KubeRay would. tests/workloads/test_kinds_queued.py does the same for every
kind on the fake API server."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import pytest

from devcluster import controllers
from devcluster.kubelets import EXIT_CODE, RUN_SECONDS
from devcluster.versions import binary
from scheduler.models import Allocation, Job
from tests.daemon.test_kubernetes_real import NODES, shared
from tests.k8s.real_api import request
from tests.k8s.real_plane import RealPlane, real_plane
from tests.workloads.builders import pod_spec
from tests.workloads.test_native_real import Native, native
from tests.workloads.test_webhook_real import USER, installed, world

pytestmark = pytest.mark.kubernetes
__all__ = ["installed", "native", "real_plane", "shared", "world"]  # the fixtures
Obj = dict[str, Any]


@contextlib.contextmanager
def manager(real_plane: RealPlane, kind: str) -> Iterator[None]:
    if real_plane.plane is None:
        pytest.skip(f"KUBECONFIG's cluster: {kind}'s manager runs beside devcluster's plane")
    if not binary(controllers.CONTROLLERS[kind].binary).is_file():
        pytest.skip(f"{kind}'s manager is not built (python -m devcluster build --peers)")
    with controllers.running(real_plane.plane, real_plane.api, kind):
        yield


def _pod(gpus: int, run_s: float | None) -> Obj:
    spec = pod_spec()
    spec["containers"][0]["resources"] = {
        "limits": {"nvidia.com/gpu": str(gpus)},
        "requests": {"cpu": "1", "memory": "1Gi"},
    }
    metadata = {"annotations": {RUN_SECONDS: str(run_s)}} if run_s is not None else {}
    return {"metadata": metadata, "spec": spec}


def _driver(seconds: int) -> Obj:
    """A JobSet driver's pod: no GPUs, one CPU, running `seconds`."""
    pod = _pod(0, seconds)
    pod["spec"]["containers"][0]["resources"] = {"requests": {"cpu": "1", "memory": "1Gi"}}
    return pod


def _jobset_with_driver(name: str, driver: Obj, worker: Obj) -> Obj:
    """A JobSet of a driver Job of one pod beside two Jobs of one `worker` pod each."""

    def replicated(what: str, replicas: int, template: Obj) -> Obj:
        job = {"parallelism": 1, "completions": 1, "backoffLimit": 0, "template": template}
        return {"name": what, "replicas": replicas, "template": {"spec": job}}

    return {
        "apiVersion": "jobset.x-k8s.io/v1alpha2",
        "kind": "JobSet",
        "metadata": {"name": name},
        "spec": {"replicatedJobs": [replicated("driver", 1, driver), replicated("w", 2, worker)]},
    }


def _pods(native: Native, job: Job) -> dict[str, Obj]:
    path = f"/api/v1/namespaces/{native.world.managed}/pods"
    query = [("labelSelector", f"gantry.io/job-id={job.pk}")]
    items = request(native.world.api, "GET", path, query=query).body["items"]
    return {p["metadata"]["name"]: p for p in items}


def test_a_jobset_is_admitted_its_jobs_pods_bound_and_it_completes(
    real_plane: RealPlane, native: Native, installed: Any
) -> None:
    """Two Jobs of one 8-GPU pod each: one gang of 2 x 8 GPUs; once Gantry unsuspends the
    JobSet, JobSet resumes its Jobs with Gantry's labels, the job controller makes the pods,
    Gantry binds one on each node; they run and exit; the JobSet completes, the job succeeds."""
    job = {"parallelism": 1, "completions": 1, "backoffLimit": 0, "template": _pod(8, 2)}
    body = {
        "apiVersion": "jobset.x-k8s.io/v1alpha2",
        "kind": "JobSet",
        "metadata": {"name": "ddp"},
        "spec": {"replicatedJobs": [{"name": "w", "replicas": 2, "template": {"spec": job}}]},
    }
    jobsets = f"/apis/jobset.x-k8s.io/v1alpha2/namespaces/{native.world.managed}/jobsets"
    with manager(real_plane, "JobSet"):
        try:
            answer = native.world.create(jobsets, body)
            assert answer.status == 201, answer.body
            assert answer.body["spec"]["suspend"] is True  # held by Gantry's webhook
            native.controller.sync()
            mirrored = Job.objects.get(spec__workload__kind="JobSet")
            assert (mirrored.replicas, mirrored.gpus_per_replica) == (2, 8)
            assert mirrored.submitted_by.username == USER

            def bound() -> dict[str, str]:
                pods = _pods(native, mirrored)
                return {
                    n: p["spec"]["nodeName"] for n, p in pods.items() if p["spec"].get("nodeName")
                }

            native.until("its pods are bound", lambda: len(bound()) == 2)
            assert sorted(bound().values()) == sorted(NODES)
            replicas = {
                p["metadata"]["labels"]["jobset.sigs.k8s.io/job-index"]
                for p in _pods(native, mirrored).values()
            }
            assert replicas == {"0", "1"}

            def completed() -> bool:
                status = request(native.world.api, "GET", f"{jobsets}/ddp").body.get("status")
                conditions = (status or {}).get("conditions") or ()
                return any(c["type"] == "Completed" and c["status"] == "True" for c in conditions)

            native.until("the job succeeds", lambda: _state(mirrored) == "succeeded")
            native.until("the JobSet completes", completed)
            native.controller.sync()
            events = native.events("ddp")
            assert {"Queued", "Admitted", "Running", "Succeeded"} <= set(events), events
        finally:
            request(
                native.world.api,
                "DELETE",
                f"{jobsets}/ddp",
                query=[("propagationPolicy", "Background")],
            )


def test_a_jobsets_driver_runs_beside_replica_0_and_outlives_its_gpu_jobs(
    real_plane: RealPlane, native: Native, installed: Any
) -> None:
    """A driver (one pod without GPUs, running longer) beside two Jobs of one 8-GPU pod: the
    GPU pods are the replicas, one per node; the driver's pod, a companion, is bound to
    replica 0's node; the GPU pods exit first and the job succeeds, the driver is left to
    finish (not deleted: the JobSet would fail), and then the JobSet completes."""
    body = _jobset_with_driver("drv", _driver(6), _pod(8, 2))
    jobsets = f"/apis/jobset.x-k8s.io/v1alpha2/namespaces/{native.world.managed}/jobsets"
    with manager(real_plane, "JobSet"):
        try:
            answer = native.world.create(jobsets, body)
            assert answer.status == 201, answer.body
            native.controller.sync()
            mirrored = Job.objects.get(spec__workload__kind="JobSet")
            # the driver's 1 CPU, 1 GiB counted with replica 0's
            assert (mirrored.replicas, mirrored.gpus_per_replica) == (2, 8)
            assert (mirrored.cpu_milli, mirrored.memory_mib) == (2000, 2048)

            def bound() -> dict[str, str]:
                pods = _pods(native, mirrored)
                return {
                    n: p["spec"]["nodeName"] for n, p in pods.items() if p["spec"].get("nodeName")
                }

            native.until("its pods are bound", lambda: len(bound()) == 3)
            pods = _pods(native, mirrored)
            (driver,) = [
                n
                for n, p in pods.items()
                if p["metadata"]["labels"].get("gantry.io/companion") == "driver"
            ]
            replica_0 = Allocation.objects.get(job=mirrored, replica=0, ended_at__isnull=True)
            assert bound()[driver] == replica_0.node.name
            assert sorted(v for n, v in bound().items() if n != driver) == sorted(NODES)

            def completed() -> bool:
                status = request(native.world.api, "GET", f"{jobsets}/drv").body.get("status")
                conditions = (status or {}).get("conditions") or ()
                return any(c["type"] == "Completed" and c["status"] == "True" for c in conditions)

            native.until("the job succeeds", lambda: _state(mirrored) == "succeeded")
            left = native.pod(driver)
            assert not left["metadata"].get("deletionTimestamp"), "the driver was deleted"
            native.until("the JobSet completes", completed)
        finally:
            request(
                native.world.api,
                "DELETE",
                f"{jobsets}/drv",
                query=[("propagationPolicy", "Background")],
            )


def test_a_jobsets_failed_driver_is_told_and_its_jobset_ends_the_job(
    real_plane: RealPlane, native: Native, installed: Any
) -> None:
    """A driver that exits 1 (its Job's backoffLimit 0) beside two GPU Jobs still running, with
    JobSet's real manager: Gantry tells the driver's failure (the job's reason, a Warning
    event on the JobSet) and leaves the attempt to the JobSet's failurePolicy (none: the
    JobSet fails), and the job ends with the JobSet, its GPUs freed."""
    driver_pod = _driver(1)
    driver_pod["metadata"]["annotations"][EXIT_CODE] = "1"
    body = _jobset_with_driver("fails", driver_pod, _pod(8, 600))
    jobsets = f"/apis/jobset.x-k8s.io/v1alpha2/namespaces/{native.world.managed}/jobsets"
    with manager(real_plane, "JobSet"):
        try:
            answer = native.world.create(jobsets, body)
            assert answer.status == 201, answer.body
            native.controller.sync()
            mirrored = Job.objects.get(spec__workload__kind="JobSet")
            seen: list[tuple[str, str]] = []

            def told() -> bool:
                mirrored.refresh_from_db()
                seen.append((mirrored.state, mirrored.reason))
                return "its replicated job 'driver' pod" in mirrored.reason

            native.until("the driver's failure is told", told)
            assert "failed (Error: exit code 1)" in mirrored.reason, seen[-1]

            def failed() -> bool:
                status = request(native.world.api, "GET", f"{jobsets}/fails").body.get("status")
                conditions = (status or {}).get("conditions") or ()
                return any(c["type"] == "Failed" and c["status"] == "True" for c in conditions)

            native.until("the JobSet fails", failed)
            native.until("the job ends", lambda: _state(mirrored) in ("failed", "cancelled"))
            mirrored.refresh_from_db()
            # JobSet deletes the Jobs of a failed JobSet: its GPU pods went, read until now
            # as lost with their nodes (requeued, then cancelled). The controller fails it
            # as it runs (attempt 0) or, when the daemon saw the pods go first and placed it
            # again, as it waits for pods that will not come (attempt 1): failed either way.
            assert mirrored.state == "failed" and mirrored.attempt <= 1, mirrored.reason
            assert mirrored.reason.startswith("its JobSet failed in Kubernetes: jobset failed")
            native.until(
                "its GPUs are freed",
                lambda: not Allocation.objects.filter(job=mirrored, ended_at__isnull=True).exists(),
            )
            native.controller.sync()
            assert "Failed" in native.events("fails")
        finally:
            request(
                native.world.api,
                "DELETE",
                f"{jobsets}/fails",
                query=[("propagationPolicy", "Background")],
            )


def test_a_leaderworkerset_group_is_admitted_whole_runs_and_ends_when_deleted(
    real_plane: RealPlane, native: Native, installed: Any
) -> None:
    """One group of a leader and a worker, 4 GPUs each: LWS's StatefulSets make the pods,
    Gantry's webhook gates them, the group is queued as the set's user once both exist, and
    admitted whole (gates removed, both bound); deleting the set cancels its job."""
    template = _pod(4, None)
    template["spec"]["restartPolicy"] = "Always"  # a StatefulSet's pods: nothing else is valid
    body = {
        "apiVersion": "leaderworkerset.x-k8s.io/v1",
        "kind": "LeaderWorkerSet",
        "metadata": {"name": "serve"},
        "spec": {
            "replicas": 1,
            "leaderWorkerTemplate": {
                "size": 2,
                "leaderTemplate": template,
                "workerTemplate": template,
            },
        },
    }
    sets = f"/apis/leaderworkerset.x-k8s.io/v1/namespaces/{native.world.managed}/leaderworkersets"
    with manager(real_plane, "LeaderWorkerSet"):
        try:
            answer = native.world.create(sets, body)
            assert answer.status == 201, answer.body

            def job() -> Job | None:
                return Job.objects.filter(spec__workload__kind="LeaderWorkerSet").first()

            def made() -> dict[str, Obj]:
                path = f"/api/v1/namespaces/{native.world.managed}/pods"
                query = [("labelSelector", "leaderworkerset.sigs.k8s.io/name=serve")]
                items = request(native.world.api, "GET", path, query=query).body["items"]
                return {p["metadata"]["name"]: p for p in items}

            # the daemon waits: a group admitted as soon as it is whole shows no gate to check
            native.until(
                "LWS's StatefulSets make the group's pods", lambda: len(made()) == 2, daemon=False
            )
            for pod in made().values():  # held by Gantry's webhook, for the set's user
                assert pod["spec"]["schedulingGates"] == [{"name": "gantry.io/admission"}]
            try:
                native.until("the group is queued", lambda: job() is not None)
            except AssertionError:
                labels = {n: p["metadata"].get("labels") for n, p in made().items()}
                raise AssertionError(f"{native.controller.refusals}; {labels}") from None
            group = job()
            assert group is not None and group.submitted_by.username == USER
            assert (group.replicas, group.gpus_per_replica) == (2, 4)
            assert group.spec["workload"]["pods"] == ["serve-0", "serve-0-1"]

            def running() -> bool:
                pods = [native.pod(name) for name in ("serve-0", "serve-0-1")]
                return all(p.get("status", {}).get("phase") == "Running" for p in pods)

            native.until("both pods run", running)
            assert {native.pod(n)["spec"]["nodeName"] for n in ("serve-0", "serve-0-1")} <= set(
                NODES
            )
            assert not native.pod("serve-0")["spec"].get("schedulingGates")
            request(native.world.alice, "DELETE", f"{sets}/serve")
            native.until("its job is cancelled", lambda: _state(group) == "cancelled")
        finally:
            request(native.world.api, "DELETE", f"{sets}/serve")


def _state(job: Job) -> str:
    job.refresh_from_db()
    return str(job.state)


# -- RayJob and TrainJob: no operator is built here, so the test plays it -------------------


def _play_operator(
    native: Native, owner: Obj, made: list[tuple[str, Obj, dict[str, str]]], run_s: float | None
) -> None:
    """What the kind's operator would do once Gantry unsuspends `owner`: its pods, from the
    templates as Gantry left them (its labels on), with the operator's labels, owned by it;
    they run `run_s` seconds (None: until deleted, as a Ray cluster's do)."""
    meta = owner["metadata"]
    reference = {
        "apiVersion": owner["apiVersion"],
        "kind": owner["kind"],
        "name": meta["name"],
        "uid": meta["uid"],
        "controller": True,
    }
    pods = f"/api/v1/namespaces/{native.world.managed}/pods"
    for name, template, labels in made:
        template_meta = template.get("metadata") or {}
        body = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": name,
                "labels": {**(template_meta.get("labels") or {}), **labels},
                "annotations": {
                    **(template_meta.get("annotations") or {}),
                    **({RUN_SECONDS: str(run_s)} if run_s is not None else {}),
                },
                "ownerReferences": [reference],
            },
            "spec": template["spec"],
        }
        answer = request(native.world.api, "POST", pods, body=body)
        assert answer.status == 201, answer.body


def _unsuspended(native: Native, path: str) -> Obj:
    native.until(
        "Gantry unsuspends it",
        lambda: request(native.world.api, "GET", path).body["spec"]["suspend"] is False,
    )
    body: Obj = request(native.world.api, "GET", path).body
    return body


def test_a_rayjob_is_admitted_and_the_pods_its_operator_would_make_are_bound(
    native: Native, installed: Any
) -> None:
    """A RayJob as nearly every RayJob is: a head without GPUs beside a group of two 8-GPU
    workers. KubeRay is not built here: once Gantry unsuspends the RayJob, the test makes the
    head and worker pods KubeRay would (owned by the RayJob, its node-type labels, the
    templates' labels as Gantry left them); Gantry binds each worker, a replica, where it
    placed it, and the head, a companion of replica 0, to replica 0's node; when the RayJob
    reports its job Complete (the test writes its status, as KubeRay would), the Gantry job
    succeeds, its cluster's pods notwithstanding. Its submitter Job (made by the test as
    KubeRay would, from the submitter template Gantry labelled) gets its pod from the plane's
    job controller, and Gantry binds that pod to replica 0's node too."""
    worker = {
        "groupName": "gpu",
        "replicas": 2,
        "minReplicas": 2,
        "maxReplicas": 2,
        "template": _pod(8, None),
    }
    head = _pod(8, None)
    head["spec"]["containers"][0]["resources"] = {"requests": {"cpu": "1", "memory": "1Gi"}}
    body = {
        "apiVersion": "ray.io/v1",
        "kind": "RayJob",
        "metadata": {"name": "ray"},
        "spec": {
            "entrypoint": "python train.py",
            "shutdownAfterJobFinishes": True,
            "rayClusterSpec": {
                "headGroupSpec": {"template": head},
                "workerGroupSpecs": [worker],
            },
        },
    }
    rayjobs = f"/apis/ray.io/v1/namespaces/{native.world.managed}/rayjobs"
    try:
        answer = native.world.create(rayjobs, body)
        assert answer.status == 201, answer.body
        assert answer.body["spec"]["suspend"] is True
        native.controller.sync()
        mirrored = Job.objects.get(spec__workload__kind="RayJob")
        # the two workers are the replicas; the head (1 CPU, 1 GiB) and KubeRay's default
        # submitter (500m, 200Mi) counted with the first (1 CPU, 1 GiB): 1000 + 1000 + 500
        # mCPU, 1024 + 1024 + 200 MiB
        assert (mirrored.replicas, mirrored.gpus_per_replica) == (2, 8)
        assert (mirrored.cpu_milli, mirrored.memory_mib) == (2500, 2248)
        admitted = _unsuspended(native, f"{rayjobs}/ray")
        cluster = admitted["spec"]["rayClusterSpec"]
        head = cluster["headGroupSpec"]["template"]
        assert head["metadata"]["labels"]["gantry.io/job-id"] == str(mirrored.pk)
        # the attempt, on every template: the API server (and Gantry's admission policy)
        # took it
        worker_labels = cluster["workerGroupSpecs"][0]["template"]["metadata"]["labels"]
        assert head["metadata"]["labels"]["gantry.io/attempt"] == "0"
        assert worker_labels["gantry.io/attempt"] == "0"
        # the head, without GPUs, is replica 0's companion; the workers are the replicas
        assert head["metadata"]["labels"]["gantry.io/companion"] == "head"
        assert "gantry.io/companion" not in worker_labels
        # KubeRay's default submitter, written out by the webhook and labelled at admission
        # (the admission policy allows Gantry's labels on it, nothing else)
        submitter = admitted["spec"]["submitterPodTemplate"]
        assert submitter["metadata"]["labels"]["gantry.io/companion"] == "submitter"
        assert submitter["spec"]["containers"][0]["resources"]["requests"]["cpu"] == "500m"
        _play_operator(
            native,
            admitted,
            [
                ("ray-head-x1", head, {"ray.io/node-type": "head", "ray.io/cluster": "ray-x"}),
                *(
                    (
                        f"ray-gpu-worker-x{index}",
                        cluster["workerGroupSpecs"][0]["template"],
                        {
                            "ray.io/node-type": "worker",
                            "ray.io/group": "gpu",
                            "ray.io/cluster": "ray-x",
                        },
                    )
                    for index in (2, 3)
                ),
            ],
            run_s=None,
        )

        def bound() -> dict[str, str]:
            pods = _pods(native, mirrored)
            return {n: p["spec"]["nodeName"] for n, p in pods.items() if p["spec"].get("nodeName")}

        workers = ("ray-gpu-worker-x2", "ray-gpu-worker-x3")
        native.until("its pods are bound", lambda: len(bound()) == 3)
        allocations = {
            a.pod_name: (a.replica, a.node.name)
            for a in Allocation.objects.filter(job=mirrored, ended_at__isnull=True)
        }
        # the workers are replicas 0 and 1 (in name order), one per node, each on its own
        assert {n: r for n, (r, _) in allocations.items()} == {workers[0]: 0, workers[1]: 1}
        assert {bound()[n] for n in workers} == set(NODES)
        assert all(bound()[n] == node for n, (_, node) in allocations.items())
        assert bound()["ray-head-x1"] == allocations[workers[0]][1]  # beside replica 0
        # KubeRay's submitter Job, owned by the RayJob, from the template as Gantry left it:
        # the plane's job controller makes its pod, which Gantry binds beside replica 0
        owner = {"apiVersion": "ray.io/v1", "kind": "RayJob", "controller": True}
        owner |= {"name": "ray", "uid": admitted["metadata"]["uid"]}
        job_body = {
            "apiVersion": "batch/v1",
            "kind": "Job",
            "metadata": {"name": "ray", "ownerReferences": [owner]},
            "spec": {"backoffLimit": 2, "template": submitter},
        }
        jobs = f"/apis/batch/v1/namespaces/{native.world.managed}/jobs"
        answer = native.world.create(jobs, job_body)
        assert answer.status == 201, answer.body
        native.until("its submitter is bound", lambda: len(bound()) == 4)
        (submitter_pod,) = set(bound()) - {"ray-head-x1", *workers}
        head_alloc = Allocation.objects.get(job=mirrored, replica=0, ended_at__isnull=True)
        assert bound()[submitter_pod] == head_alloc.node.name
        native.until("the job runs", lambda: _state(mirrored) == "running")
        status = {"status": {"jobDeploymentStatus": "Complete", "jobStatus": "SUCCEEDED"}}
        answer = request(
            native.world.api,
            "PATCH",
            f"{rayjobs}/ray/status",
            body=status,
            content_type="application/merge-patch+json",
        )
        assert answer.status == 200, answer.body
        native.until("the job succeeds", lambda: _state(mirrored) == "succeeded")
    finally:
        request(
            native.world.api,
            "DELETE",
            f"{rayjobs}/ray",
            query=[("propagationPolicy", "Background")],
        )


def test_a_trainjob_is_admitted_and_the_pods_its_trainer_would_make_are_bound_and_run(
    native: Native, installed: Any
) -> None:
    """The Trainer is not built here: once Gantry unsuspends the TrainJob (its runtime patch
    labelling the trainer's `node` pods, and its initializers' as companions), the test makes
    the pods the Trainer's JobSet would (the patch's labels, JobSet's and the Job
    controller's), first the initializers', which Gantry binds to replica 0's node, then the
    nodes', which it binds one per node; they run and exit, and the job succeeds."""
    trainer = {
        "numNodes": 2,
        "image": "registry.k8s.io/pause:3.10",
        "resourcesPerNode": {
            "limits": {"nvidia.com/gpu": "8"},
            "requests": {"cpu": "1", "memory": "1Gi"},
        },
    }
    body = {
        "apiVersion": "trainer.kubeflow.org/v1alpha1",
        "kind": "TrainJob",
        "metadata": {"name": "train"},
        "spec": {"runtimeRef": {"name": RUNTIME}, "trainer": trainer},
    }
    trainjobs = f"/apis/trainer.kubeflow.org/v1alpha1/namespaces/{native.world.managed}/trainjobs"
    runtimes = "/apis/trainer.kubeflow.org/v1alpha1/clustertrainingruntimes"
    try:
        answer = request(native.world.api, "POST", runtimes, body=_runtime())
        assert answer.status == 201, answer.body
        answer = native.world.create(trainjobs, body)
        assert answer.status == 201, answer.body
        native.controller.sync()
        mirrored = Job.objects.get(spec__workload__kind="TrainJob")
        assert (mirrored.replicas, mirrored.gpus_per_replica) == (2, 8)
        # its runtime's two initializers (2 CPUs, 2 GiB each) counted with the first node
        # (1 CPU, 1 GiB): 1000 + 2 x 2000 mCPU, 1024 + 2 x 2048 MiB
        assert (mirrored.cpu_milli, mirrored.memory_mib) == (5000, 5120)
        admitted = _unsuspended(native, f"{trainjobs}/train")
        (patch,) = [
            p for p in admitted["spec"]["runtimePatches"] if p["manager"] == "gantry.io/scheduler"
        ]
        jobs = patch["trainingRuntimeSpec"]["template"]["spec"]["replicatedJobs"]
        (node,) = [j for j in jobs if j["name"] == "node"]
        spec = pod_spec()
        spec["schedulerName"] = "gantry"
        spec["containers"][0]["resources"] = trainer["resourcesPerNode"]
        template = {"metadata": node["template"]["spec"]["template"]["metadata"], "spec": spec}
        made = [
            (
                f"train-node-0-{index}-x",
                template,
                {
                    "jobset.sigs.k8s.io/jobset-name": "train",
                    "jobset.sigs.k8s.io/replicatedjob-name": "node",
                    "jobset.sigs.k8s.io/job-index": "0",
                    "batch.kubernetes.io/job-name": "train-node-0",
                    "batch.kubernetes.io/job-completion-index": str(index),
                },
            )
            for index in range(2)
        ]

        def bound() -> dict[str, str]:
            pods = _pods(native, mirrored)
            return {n: p["spec"]["nodeName"] for n, p in pods.items() if p["spec"].get("nodeName")}

        # First its initializers (the nodes depend on them), labelled by Gantry's runtime
        # patch as companions of the first node: bound to replica 0's node, as no replica.
        initializers = []
        for job in [j for j in jobs if j["name"] != "node"]:
            init_spec = pod_spec()
            init_spec["schedulerName"] = "gantry"
            init_meta = job["template"]["spec"]["template"]["metadata"]
            labels = {
                "jobset.sigs.k8s.io/jobset-name": "train",
                "jobset.sigs.k8s.io/replicatedjob-name": job["name"],
                "jobset.sigs.k8s.io/job-index": "0",
                "batch.kubernetes.io/job-name": f"train-{job['name']}-0",
                "batch.kubernetes.io/job-completion-index": "0",
            }
            name = f"train-{job['name']}-0-0-x"
            initializers.append((name, {"metadata": init_meta, "spec": init_spec}, labels))
        assert len(initializers) == 2
        _play_operator(native, admitted, initializers, run_s=1)
        native.until("its initializers are bound", lambda: len(bound()) == 2)
        head_alloc = Allocation.objects.get(job=mirrored, replica=0, ended_at__isnull=True)
        assert set(bound().values()) == {head_alloc.node.name}
        _play_operator(native, admitted, made, run_s=2)
        native.until("its pods are bound", lambda: len(bound()) == 4)
        assert sorted(bound()[n] for n, _, _ in made) == sorted(NODES)
        native.until("the job succeeds", lambda: _state(mirrored) == "succeeded")
    finally:
        request(
            native.world.api,
            "DELETE",
            f"{trainjobs}/train",
            query=[("propagationPolicy", "Background")],
        )
        request(native.world.api, "DELETE", f"{runtimes}/{RUNTIME}")


RUNTIME = "gantry-test-initializers"


def _runtime() -> Obj:
    """A ClusterTrainingRuntime as the Trainer's own declare theirs: a dataset and a model
    initializer, then the training nodes (the TrainJob's `spec.trainer`)."""

    def job(name: str, cpu: str, memory: str) -> Obj:
        spec = pod_spec()
        spec["containers"][0]["name"] = name
        spec["containers"][0]["resources"] = {"requests": {"cpu": cpu, "memory": memory}}
        return {"name": name, "template": {"spec": {"template": {"spec": spec}}}}

    node = job("node", "1", "1Gi")
    node["dependsOn"] = [
        {"name": "dataset-initializer", "status": "Complete"},
        {"name": "model-initializer", "status": "Complete"},
    ]
    replicated = [job("dataset-initializer", "2", "2Gi"), job("model-initializer", "2", "2Gi")]
    return {
        "apiVersion": "trainer.kubeflow.org/v1alpha1",
        "kind": "ClusterTrainingRuntime",
        "metadata": {"name": RUNTIME},
        "spec": {"template": {"spec": {"replicatedJobs": [*replicated, node]}}},
    }


# -- PyTorchJob: Kubeflow's training operator is not built here either -----------------------


def test_a_pytorchjob_is_admitted_and_the_pods_its_operator_would_make_are_bound_as_replicas(
    native: Native, installed: Any
) -> None:
    """The training operator (v1.9.3) is NOT running here: the test plays it. Once Gantry
    unsuspends the PyTorchJob (`spec.runPolicy.suspend` false, its Master and Worker templates
    labelled), the test makes the pods the operator would (`<name>-master-0`,
    `<name>-worker-0`, owned by the PyTorchJob, its replica-type and replica-index labels, the
    templates' labels as Gantry left them), and Gantry binds them as replicas 0 (Master) and 1
    (Worker 0); they run and exit, and the job succeeds; the Succeeded condition the operator
    then writes (the test writes it) changes nothing."""
    spec = {
        "Master": {"replicas": 1, "restartPolicy": "OnFailure", "template": _pod(8, None)},
        "Worker": {"replicas": 1, "restartPolicy": "OnFailure", "template": _pod(8, None)},
    }
    body = {
        "apiVersion": "kubeflow.org/v1",
        "kind": "PyTorchJob",
        "metadata": {"name": "pt"},
        "spec": {"pytorchReplicaSpecs": spec},
    }
    pytorchjobs = f"/apis/kubeflow.org/v1/namespaces/{native.world.managed}/pytorchjobs"
    try:
        answer = native.world.create(pytorchjobs, body)
        assert answer.status == 201, answer.body
        assert answer.body["spec"]["runPolicy"]["suspend"] is True
        native.controller.sync()
        mirrored = Job.objects.get(spec__workload__kind="PyTorchJob")
        assert (mirrored.replicas, mirrored.gpus_per_replica) == (2, 8)

        def admitted() -> Obj:
            found: Obj = request(native.world.api, "GET", f"{pytorchjobs}/pt").body
            return found

        native.until(
            "Gantry unsuspends it", lambda: admitted()["spec"]["runPolicy"]["suspend"] is False
        )
        replicas = admitted()["spec"]["pytorchReplicaSpecs"]
        made = []
        for rtype in ("Worker", "Master"):
            template = replicas[rtype]["template"]
            assert template["metadata"]["labels"]["gantry.io/job-id"] == str(mirrored.pk)
            labels = {
                "training.kubeflow.org/operator-name": "pytorchjob-controller",
                "training.kubeflow.org/job-name": "pt",
                "training.kubeflow.org/replica-type": rtype.lower(),
                "training.kubeflow.org/replica-index": "0",
            }
            made.append((f"pt-{rtype.lower()}-0", template, labels))
        _play_operator(native, admitted(), made, run_s=2)

        def bound() -> dict[str, str]:
            pods = _pods(native, mirrored)
            return {n: p["spec"]["nodeName"] for n, p in pods.items() if p["spec"].get("nodeName")}

        native.until("its pods are bound", lambda: len(bound()) == 2)
        assert sorted(bound().values()) == sorted(NODES)
        allocations = {a.pod_name: a.replica for a in mirrored.allocations.all()}
        assert allocations == {"pt-master-0": 0, "pt-worker-0": 1}
        native.until("the job succeeds", lambda: _state(mirrored) == "succeeded")
        status = {"status": {"conditions": [{"type": "Succeeded", "status": "True"}]}}
        answer = request(
            native.world.api,
            "PATCH",
            f"{pytorchjobs}/pt/status",
            body=status,
            content_type="application/merge-patch+json",
        )
        assert answer.status == 200, answer.body
        native.controller.sync()
        assert _state(mirrored) == "succeeded"
    finally:
        request(
            native.world.api,
            "DELETE",
            f"{pytorchjobs}/pt",
            query=[("propagationPolicy", "Background")],
        )
