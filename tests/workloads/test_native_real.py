"""Pods created with the client, as `kubectl apply` creates them, on the real control plane
(issue 37): Gantry's webhook holds them, the controller queues them as the user who created
them, the daemon admits them on the nodes it chose, the kubelets run them, and the user reads
Gantry's decisions in the pod's events. The fast mirror: tests/workloads/test_controller.py."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest

from devcluster.kubelets import RUN_SECONDS
from scheduler.models import Job
from scheduler.workloads.controller import WorkloadController
from tests.conftest import build_org
from tests.daemon.test_kubernetes_real import NODES, Real, Shared, only_our_nodes, shared
from tests.k8s.real_api import request
from tests.k8s.real_plane import real_plane
from tests.workloads.builders import pod_spec
from tests.workloads.test_webhook_real import USER, World, world

pytestmark = pytest.mark.kubernetes
__all__ = ["real_plane", "shared", "world"]  # the fixtures, for this module

Obj = dict[str, Any]


class Native:
    def __init__(self, world: World, real: Real) -> None:
        self.world, self.real = world, real
        self.controller = WorkloadController(real.backend)

    def create(self, name: str, gpus: int) -> None:
        spec = pod_spec()
        spec["containers"][0]["resources"] = {
            "limits": {"nvidia.com/gpu": str(gpus)},
            "requests": {"cpu": "1", "memory": "1Gi"},
        }
        body = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": spec}
        answer = self.world.create(f"/api/v1/namespaces/{self.world.managed}/pods", body)
        assert answer.status == 201, answer.body

    def pod(self, name: str) -> Obj:
        path = f"/api/v1/namespaces/{self.world.managed}/pods/{name}"
        return request(self.world.api, "GET", path).body

    def events(self, name: str) -> list[str]:
        path = f"/api/v1/namespaces/{self.world.managed}/events"
        query = [("fieldSelector", f"involvedObject.name={name}")]
        answer = request(self.world.api, "GET", path, query=query)
        return [e["reason"] for e in answer.body["items"]]

    def until(self, what: str, done: Any, within_s: float = 90.0, daemon: bool = True) -> None:
        """Drive the controller, the kubelets and (unless `daemon` is False: nothing is
        admitted meanwhile) the daemon until `done()`: a bound on liveness, not a timing
        (real controllers, e.g. a freshly started LWS manager, took over 30 s on a loaded
        two-core host)."""
        deadline = time.monotonic() + within_s
        while not done():
            assert time.monotonic() < deadline, f"not reached within {within_s:.0f} s: {what}"
            self.controller.sync()
            self.real.kubelets.step()
            self.real.heartbeat()
            if daemon:
                self.real.cycle()
            else:
                time.sleep(0.2)


@pytest.fixture
def native(db: Any, world: World, shared: Shared) -> Iterator[Native]:
    org = build_org()
    alice = org.users["alice"]
    alice.username = USER  # the Gantry user the API server authenticates as alice
    alice.save(update_fields=["username"])
    org.proj_alpha.namespace = world.managed
    org.proj_alpha.save(update_fields=["namespace"])
    real = Real(org, shared.api, shared.kubelets)
    with only_our_nodes(shared):
        yield Native(world, real)
        for name in ("train", "wait", "third"):
            path = f"/api/v1/namespaces/{world.managed}/pods/{name}"
            request(world.api, "DELETE", path, query=[("gracePeriodSeconds", "0")])
        jobs = f"/apis/batch/v1/namespaces/{world.managed}/jobs/ddp"
        request(world.api, "DELETE", jobs, query=[("propagationPolicy", "Background")])
        _drain(world, real)
        real.kubelets.held.clear()
        real.kubelets.endings.clear()


def _drain(world: World, real: Real, within_s: float = 60.0) -> None:
    """Step the kubelets until no pod of a Gantry job is left in the namespace the module's
    tests share: the next test's jobs may take the same ids (SQLite's sequence rolls back
    with the test's transaction; PostgreSQL's does not), and a pod of an object deleted at
    the end of a test (its garbage collected in the background) would be adopted as theirs."""
    path = f"/api/v1/namespaces/{world.managed}/pods"
    query = [("labelSelector", "gantry.io/job-id")]
    deadline = time.monotonic() + within_s
    while left := [
        p["metadata"]["name"] for p in request(world.api, "GET", path, query=query).body["items"]
    ]:
        assert time.monotonic() < deadline, (
            f"pods of the test's jobs left after {within_s:.0f} s: {left}"
        )
        real.kubelets.step()
        time.sleep(0.2)


def job_of(name: str) -> Job:
    """The job of the pod `name` (read in Python: SQLite has no JSON containment)."""
    (found,) = [j for j in Job.objects.all() if name in j.spec.get("workload", {}).get("pods", ())]
    return found


def test_a_pod_created_by_a_user_runs_where_gantry_placed_it(native: Native) -> None:
    native.create("train", gpus=4)
    native.controller.sync()
    job = job_of("train")
    assert (job.submitted_by.username, job.state, job.gpus_per_replica) == (USER, "queued", 4)
    native.until("the pod runs", lambda: native.pod("train")["status"].get("phase") == "Running")
    pod = native.pod("train")
    assert pod["spec"]["nodeName"] in NODES and not pod["spec"].get("schedulingGates")
    native.until("the job runs", lambda: job_of("train").state == "running")
    native.controller.sync()
    assert {"Queued", "Admitted", "Running"} <= set(native.events("train"))


def test_what_does_not_fit_waits_gated_and_a_deleted_pod_frees_its_gpus(native: Native) -> None:
    """Two 8-GPU nodes: two 8-GPU pods run, the third waits gated with its reason as an
    event; deleting a running one cancels its job and the third is admitted."""
    for name in ("train", "wait", "third"):
        native.create(name, gpus=8)

    def placed() -> list[str]:
        names = ("train", "wait", "third")
        return [n for n in names if (native.pod(n).get("spec") or {}).get("nodeName")]

    native.until("two are placed", lambda: len(placed()) == 2)
    (waiting,) = {"train", "wait", "third"} - set(placed())
    assert native.pod(waiting)["spec"]["schedulingGates"] == [{"name": "gantry.io/admission"}]
    native.controller.sync()
    assert "Queued" in native.events(waiting)
    victim = placed()[0]
    path = f"/api/v1/namespaces/{native.world.managed}/pods/{victim}"
    request(native.world.alice, "DELETE", path, query=[("gracePeriodSeconds", "0")])
    native.until("the waiting pod is placed", lambda: waiting in placed())
    assert job_of(victim).state == "cancelled"


def _job(name: str, parallelism: int, gpus: int, run_s: float) -> Obj:
    spec = pod_spec()
    spec["containers"][0]["resources"] = {
        "limits": {"nvidia.com/gpu": str(gpus)},
        "requests": {"cpu": "1", "memory": "1Gi"},
    }
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name},
        "spec": {
            "parallelism": parallelism,
            "completions": parallelism,
            "completionMode": "Indexed",
            "backoffLimit": 0,
            "template": {
                "metadata": {"annotations": {RUN_SECONDS: str(run_s)}},
                "spec": spec,
            },
        },
    }


def test_a_job_created_by_a_user_is_admitted_runs_its_pods_where_gantry_placed_them_and_completes(
    native: Native,
) -> None:
    """The real job controller makes the pods once Gantry unsuspends the Job; Gantry binds
    them to the nodes it chose; they run and exit; the Job completes and the job succeeds."""
    jobs = f"/apis/batch/v1/namespaces/{native.world.managed}/jobs"
    answer = native.world.create(jobs, _job("ddp", parallelism=2, gpus=8, run_s=2))
    assert answer.status == 201, answer.body
    assert answer.body["spec"]["suspend"] is True  # held by the webhook
    native.controller.sync()
    job = Job.objects.get(spec__workload__kind="Job")
    assert (job.replicas, job.gpus_per_replica, job.submitted_by.username) == (2, 8, USER)

    def complete() -> bool:
        status = request(native.world.api, "GET", f"{jobs}/ddp").body.get("status") or {}
        return any(c["type"] == "Complete" for c in status.get("conditions") or ())

    native.until("its pods are bound", lambda: len(_bound(native, job)) == 2)
    assert set(_bound(native, job).values()) == set(NODES)  # one 8-GPU pod on each node
    native.until("the job succeeds", lambda: job_of_kind("Job").state == "succeeded")
    native.until("the Job completes", complete)
    native.controller.sync()
    events = native.events("ddp")
    assert {"Queued", "Admitted", "Running", "Succeeded"} <= set(events), events
    for _ in range(3):  # the daemon's cycles after the end leave the ended pods to the Job
        native.real.cycle()
    path = f"/api/v1/namespaces/{native.world.managed}/pods"
    query = [("labelSelector", f"gantry.io/job-id={job.pk}")]
    pods = request(native.world.api, "GET", path, query=query).body["items"]
    assert len(pods) == 2, "kubectl logs reads a finished Job's pods"
    assert not [p["metadata"]["name"] for p in pods if p["metadata"].get("deletionTimestamp")]
    assert {p["status"]["phase"] for p in pods} == {"Succeeded"}


def job_of_kind(kind: str) -> Job:
    return Job.objects.get(spec__workload__kind=kind)


def _bound(native: Native, job: Job) -> dict[str, str]:
    path = f"/api/v1/namespaces/{native.world.managed}/pods"
    query = [("labelSelector", f"gantry.io/job-id={job.pk}")]
    pods = request(native.world.api, "GET", path, query=query).body["items"]
    return {p["metadata"]["name"]: p["spec"]["nodeName"] for p in pods if p["spec"].get("nodeName")}
