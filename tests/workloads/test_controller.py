"""Pods created in Kubernetes queue through Gantry (issue 37): the webhook holds them, the
controller mirrors them into Gantry jobs and tells the user what Gantry decided, the daemon
admits them where it placed them. Over the fake API server, with the daemon on a fake clock
(tests/workloads/test_native_real.py does the same on the real control plane)."""

from __future__ import annotations

import copy
import io
import itertools
import time
from collections.abc import Callable, Iterator
from datetime import timedelta
from typing import Any

import jsonpatch
import pytest
import yaml
from django.core.management import CommandError, call_command
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from scheduler.backends.kubernetes.backend import KubernetesBackend
from scheduler.backends.kubernetes.config import KubernetesConfig
from scheduler.backends.retry import RetryPolicy
from scheduler.daemon import workloads as reconcile_workloads
from scheduler.daemon.loop import Daemon
from scheduler.jobs.services import job_cancel, job_submit
from scheduler.leader import Lease
from scheduler.models import Allocation, Job, JobQueueEstimate
from scheduler.workloads import controller as controller_module
from scheduler.workloads import order, status
from scheduler.workloads.controller import WorkloadController
from scheduler.workloads.kinds import JOB, POD
from scheduler.workloads.mutate import GATE, plan
from tenants.models import Project
from tests.conftest import Org, build_org, job_spec
from tests.daemon.conftest import FakeClock
from tests.k8s.conftest import api_client_for, started_fake
from tests.k8s.fake_apiserver import FakeApiServer

Obj = dict[str, Any]


def pod(name: str, gpus: int = 4, **labels: str) -> Obj:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": dict(labels)},
        "spec": {
            "restartPolicy": "Never",
            "containers": [
                {
                    "name": "main",
                    "image": "registry.example.com/nlp/bert:1.2",
                    "command": ["python", "train.py"],
                    "resources": {
                        "limits": {"nvidia.com/gpu": str(gpus)},
                        "requests": {"cpu": "2", "memory": "8Gi"},
                    },
                }
            ],
        },
    }


class World:
    def __init__(self, org: Org, fake: FakeApiServer) -> None:
        self.org, self.fake = org, fake
        self.namespace = org.proj_alpha.namespace
        fake.add_namespace(self.namespace, {"app.kubernetes.io/managed-by": "gantry"})
        self.clock = FakeClock()
        self.api = api_client_for(fake.url)
        policy = RetryPolicy(attempts=3, base_s=0.0, cap_s=0.0)
        self.backend = KubernetesBackend(
            self.api, KubernetesConfig(request_timeout_s=5.0), policy=policy, sleep=lambda _s: None
        )
        lease = Lease("fake-k8s", ttl_s=30)
        self.daemon = Daemon(self.backend, lease=lease, clock=self.clock, sleep=lambda _s: None)
        self.controller = WorkloadController(self.backend)

    def create(self, body: Obj, user: str = "alice") -> Obj:
        """What `kubectl create` makes of `body` through Gantry's webhook."""
        held = jsonpatch.apply_patch(copy.deepcopy(body), plan(POD, body, user))
        return self.fake.create("pods", self.namespace, held)

    def step(self, seconds: float = 1.0) -> None:
        """The controller's pass, then the daemon's cycle."""
        self.controller.sync()
        self.clock.advance(seconds)
        self.daemon.step()

    def pod(self, name: str) -> Obj | None:
        return self.fake.get("pods", self.namespace, name)

    def events(self, name: str) -> list[tuple[str, str]]:
        return [
            (e["reason"], e["message"])
            for e in self.fake.list_objects("events", self.namespace, {})["items"]
            if e["involvedObject"]["name"] == name
        ]


@pytest.fixture
def world(db: Any) -> Iterator[World]:
    fake = started_fake("k8s-gpu-1", "k8s-gpu-2")
    made = World(build_org(), fake)
    yield made
    made.api.close()
    fake.stop()


def mirrored(name: str) -> Job:
    """The job of the pod `name` (read in Python: SQLite has no JSON containment)."""
    (found,) = [j for j in Job.objects.all() if name in j.spec.get("workload", {}).get("pods", ())]
    return found


def test_a_pod_created_in_kubernetes_is_queued_admitted_run_and_ended_by_gantry(
    world: World,
) -> None:
    world.create(pod("train"))
    world.controller.sync()
    job = mirrored("train")
    assert (job.submitted_by.username, job.project_id) == ("alice", world.org.proj_alpha.pk)
    assert (job.replicas, job.gpus_per_replica, job.cpu_milli, job.memory_mib) == (1, 4, 2000, 8192)
    assert job.state == "queued" and job.spec["workload"]["kind"] == "Pod"
    world.step()  # the daemon admits it: labelled as Gantry's, ungated, bound
    held = world.pod("train")
    assert held is not None and held["spec"]["nodeName"] in ("k8s-gpu-1", "k8s-gpu-2")
    assert GATE not in [g["name"] for g in held["spec"].get("schedulingGates") or ()]
    assert held["metadata"]["labels"]["gantry.io/job-id"] == str(job.pk)
    alloc = Allocation.objects.get(job=job)
    assert (alloc.pod_name, alloc.node.name) == ("train", held["spec"]["nodeName"])
    world.fake.run_container(world.namespace, "train")
    world.step()
    job.refresh_from_db()
    assert job.state == "running"
    world.fake.set_pod_status(world.namespace, "train", {"phase": "Succeeded"})
    world.step()
    world.step()
    job.refresh_from_db()
    assert job.state == "succeeded"
    reasons = sorted(reason for reason, _ in world.events("train"))
    assert reasons == ["Admitted", "Queued", "Running", "Succeeded"]  # each told once
    assert Job.objects.filter(spec__workload__kind="Pod").count() == 1  # one object, one job


def test_what_waits_says_why_in_its_events_and_stays_gated(world: World) -> None:
    """Two 8-GPU nodes, 16 GPUs of quota for team A: the third 8-GPU pod waits, gated, and
    its event says it is queued and why."""
    for name in ("a", "b", "c"):
        world.create(pod(name, gpus=8))
    world.step()
    world.step()
    waiting = [n for n in ("a", "b", "c") if not world.pod(n)["spec"].get("nodeName")]
    assert len(waiting) == 1
    job = mirrored(waiting[0])
    assert job.state == "queued" and job.reason
    world.controller.sync()
    message = dict(world.events(waiting[0]))["Queued"]
    assert f"Gantry job {job.pk}" in message and "queued" in message
    gates = [g["name"] for g in world.pod(waiting[0])["spec"]["schedulingGates"]]
    assert gates == [GATE]


def test_a_pod_group_waits_for_all_its_pods_then_is_one_gang(world: World) -> None:
    group = {"gantry.io/pod-group": "ddp", "gantry.io/pod-group-size": "2"}
    world.create(pod("ddp-0", **group))
    world.controller.sync()
    assert not Job.objects.exists()  # one of two: nothing is queued yet
    world.create(pod("ddp-1", **group))
    world.step()
    job = mirrored("ddp-0")
    assert (job.replicas, job.spec["workload"]["pods"]) == (2, ["ddp-0", "ddp-1"])
    nodes = {world.pod(n)["spec"].get("nodeName") for n in ("ddp-0", "ddp-1")}
    assert None not in nodes, "a gang binds whole"


def test_a_deleted_pod_cancels_its_job_and_frees_its_quota(world: World) -> None:
    for name in ("a", "b", "c"):
        world.create(pod(name, gpus=8))
    world.step()
    world.step()
    waiting = next(n for n in ("a", "b", "c") if not world.pod(n)["spec"].get("nodeName"))
    running = next(n for n in ("a", "b", "c") if n != waiting)
    world.fake.delete("pods", world.namespace, running, 0)
    world.step()  # the controller cancels the job of the deleted pod; its GPUs are freed
    world.step()
    world.step()
    assert mirrored(running).state == "cancelled"
    assert "deleted in Kubernetes" in mirrored(running).events.last().message
    assert world.pod(waiting)["spec"].get("nodeName"), "the waiting pod got the freed GPUs"


def test_a_user_gantry_does_not_know_is_told_and_nothing_is_queued(world: World) -> None:
    world.create(pod("stranger"), user="mallory")
    world.controller.sync()
    world.controller.sync()
    assert not Job.objects.exists()
    events = world.events("stranger")
    assert len(events) == 1, "told once, not every pass"
    assert events[0][0] == "Refused" and "'mallory'" in events[0][1]


def test_a_member_over_the_limits_is_refused_with_the_specs_words(world: World) -> None:
    world.create(pod("huge", gpus=64))
    world.controller.sync()
    assert not Job.objects.exists()
    (reason, message), *_ = world.events("huge")
    assert reason == "Refused" and "gpu" in message.lower()


def test_a_restarted_controller_queues_nothing_twice(world: World) -> None:
    world.create(pod("once"))
    world.controller.sync()
    world.controller = WorkloadController(world.backend)  # the process restarted
    world.step()
    world.step()
    assert Job.objects.count() == 1
    assert mirrored("once").state in ("binding", "running")


def test_a_failed_list_changes_nothing(world: World) -> None:
    world.create(pod("kept"))
    world.controller.sync()
    world.fake.inject("503", r"^/api/v1/pods$", method="GET", count=100)
    with pytest.raises(Exception, match="503"):
        world.controller.sync()
    assert mirrored("kept").state == "queued", "a pod not listed is not a deleted pod"


def kubeconfig_for(url: str, path: Any) -> Any:
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "fake", "cluster": {"server": url}}],
        "users": [{"name": "admin", "user": {"token": "t"}}],
        "contexts": [{"name": "fake", "context": {"cluster": "fake", "user": "admin"}}],
        "current-context": "fake",
    }
    path.write_text(yaml.safe_dump(config))
    return path


def test_the_command_runs_a_pass_with_the_clusters_credentials(
    world: World, tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    world.create(pod("cli"))
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    monkeypatch.setenv("KUBECONFIG", str(kubeconfig_for(world.fake.url, tmp_path / "config")))
    out = io.StringIO()
    call_command("run_workload_controller", "--once", stdout=out)
    assert "listed 1 held pods: 1 queued" in out.getvalue()
    assert mirrored("cli").state == "queued"


def test_the_command_says_when_it_has_no_credentials(
    db: Any, tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "missing"))
    with pytest.raises(CommandError, match="credentials could not be loaded"):
        call_command("run_workload_controller", "--once")
    with pytest.raises(CommandError, match="--interval"):
        call_command("run_workload_controller", "--interval", "0")
    with pytest.raises(CommandError, match="--queueing-budget must be from"):
        call_command("run_workload_controller", "--queueing-budget", "0")


# -- batch/v1 Jobs ---------------------------------------------------------------------------


def job(name: str, parallelism: int = 2, gpus: int = 4, **spec: Any) -> Obj:
    template = pod("unused", gpus=gpus)
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name, "labels": {}},
        "spec": {
            "parallelism": parallelism,
            "completions": parallelism,
            "completionMode": "Indexed",
            "template": {"metadata": {}, "spec": template["spec"]},
            **spec,
        },
    }


class JobController:
    """Plays Kubernetes' Job controller on the fake: an unsuspended Job gets its pods, from
    its template, under names of its own; a suspended one has them deleted."""

    def __init__(self, world: World) -> None:
        self.world = world

    def step(self, name: str) -> list[str]:
        fake, namespace = self.world.fake, self.world.namespace
        obj = fake.get("jobs", namespace, name)
        assert obj is not None
        mine = [
            p
            for p in fake.list_objects("pods", namespace, {})["items"]
            if p["metadata"].get("labels", {}).get("batch.kubernetes.io/job-name") == name
        ]
        if obj["spec"]["suspend"]:
            for p in mine:
                fake.delete("pods", namespace, p["metadata"]["name"], 0)
            return []
        if not mine:
            template = obj["spec"]["template"]
            for index in range(obj["spec"]["parallelism"]):
                labels = {
                    **(template.get("metadata") or {}).get("labels", {}),
                    "batch.kubernetes.io/job-name": name,
                    "batch.kubernetes.io/job-completion-index": str(index),
                }
                body = {
                    "metadata": {"name": f"{name}-{index}-x{index}z", "labels": labels},
                    "spec": copy.deepcopy(template["spec"]),
                }
                fake.create("pods", namespace, body)
        return sorted(
            p["metadata"]["name"]
            for p in fake.list_objects("pods", namespace, {})["items"]
            if p["metadata"].get("labels", {}).get("batch.kubernetes.io/job-name") == name
        )


def create_job(world: World, body: Obj, user: str = "alice") -> Obj:
    held = jsonpatch.apply_patch(copy.deepcopy(body), plan(JOB, body, user))
    return world.fake.create("jobs", world.namespace, held)


def test_a_job_created_in_kubernetes_is_admitted_and_its_controllers_pods_bound(
    world: World,
) -> None:
    create_job(world, job("train", parallelism=2))
    world.controller.sync()
    mirrored_job = Job.objects.get(spec__workload__kind="Job")
    assert (mirrored_job.replicas, mirrored_job.gpus_per_replica, mirrored_job.state) == (
        2,
        4,
        "queued",
    )
    world.step()  # placed: the Job is labelled for the attempt and unsuspended
    admitted = world.fake.get("jobs", world.namespace, "train")
    assert admitted["spec"]["suspend"] is False
    labels = admitted["spec"]["template"]["metadata"]["labels"]
    assert labels["gantry.io/job-id"] == str(mirrored_job.pk)
    names = JobController(world).step("train")  # its controller makes the pods
    world.step()  # adopted and bound
    nodes = {n: world.pod(n)["spec"].get("nodeName") for n in names}
    allocs = {a.pod_name: a.node.name for a in Allocation.objects.filter(job=mirrored_job)}
    assert allocs == nodes and None not in nodes.values()
    for name in names:
        world.fake.run_container(world.namespace, name)
    world.step()
    mirrored_job.refresh_from_db()
    assert mirrored_job.state == "running"
    for name in names:
        world.fake.set_pod_status(world.namespace, name, {"phase": "Succeeded"})
    world.step()
    world.step()
    mirrored_job.refresh_from_db()
    assert mirrored_job.state == "succeeded"
    assert world.fake.get("jobs", world.namespace, "train")["spec"]["suspend"] is False
    for name in names:  # left to the Job (kubectl logs reads them), not deleted by Gantry
        pod = world.pod(name)
        assert pod is not None and not pod["metadata"].get("deletionTimestamp"), name
    events = [
        e["reason"]
        for e in world.fake.list_objects("events", world.namespace, {})["items"]
        if e["involvedObject"]["kind"] == "Job"
    ]
    assert sorted(events) == ["Admitted", "Queued", "Running", "Succeeded"]


def run_job(world: World, body: Obj) -> list[str]:
    """Create `body`, let Gantry admit it and its controller make its pods, bound and
    started: their names."""
    create_job(world, body)
    world.step()
    names = JobController(world).step(body["metadata"]["name"])
    world.step()
    for name in names:
        world.fake.run_container(world.namespace, name)
    world.step()
    return names


def test_a_finished_jobs_pods_left_to_it_are_judged_once_not_at_every_cycle(
    world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The ended pods a Job keeps (for kubectl logs) stay listed until its controller or TTL
    removes them: the daemon reads their jobs once, not at every cycle while they stay."""
    names = run_job(world, job("train", parallelism=2))
    for name in names:
        world.fake.set_pod_status(world.namespace, name, {"phase": "Succeeded"})
    world.step()
    world.step()
    assert Job.objects.get(spec__workload__kind="Job").state == "succeeded"
    judged: list[str] = []
    real = reconcile_workloads.left_to_their_jobs

    def spy(pods: Any) -> set[str]:
        judged.extend(p.name for p in pods)
        return real(pods)

    monkeypatch.setattr(reconcile_workloads, "left_to_their_jobs", spy)
    for _ in range(3):
        world.step()
    assert not set(judged) & set(names), judged
    assert all(world.pod(name) is not None for name in names)


def test_a_job_whose_pods_never_come_fails_at_the_binding_deadline_and_is_suspended(
    world: World,
) -> None:
    create_job(world, job("never", parallelism=1))
    world.step()
    mirrored_job = Job.objects.get(spec__workload__kind="Job")
    for _ in range(4):
        world.step(200.0)  # past the binding deadline (600 s), no pod made
    mirrored_job.refresh_from_db()
    assert mirrored_job.state == "failed", mirrored_job.reason
    assert "has not made the pod yet" in mirrored_job.reason
    assert world.fake.get("jobs", world.namespace, "never")["spec"]["suspend"] is True


def test_a_deleted_job_cancels_its_gantry_job(world: World) -> None:
    create_job(world, job("gone", parallelism=1))
    world.controller.sync()
    world.fake.delete("jobs", world.namespace, "gone", 0)
    world.controller.sync()
    cancelled = Job.objects.get(spec__workload__kind="Job")
    assert cancelled.state == "cancelled"
    assert "Job gone was deleted in Kubernetes" in cancelled.events.last().message


def test_a_work_queue_job_is_refused_with_the_reason(world: World) -> None:
    create_job(world, job("queue", parallelism=2, completions=10))
    world.controller.sync()
    assert not Job.objects.exists()
    (event,) = world.fake.list_objects("events", world.namespace, {})["items"]
    assert event["involvedObject"]["kind"] == "Job" and event["involvedObject"]["uid"]
    assert "completions must equal parallelism" in event["message"]


def preempt_running(world: World, low: Job, make_pods: Callable[[str], list[str]]) -> Job:
    """Run `low`'s pods (`make_pods`: its kind's controller, played, making or deleting the
    object "low"'s pods), then, past the minimum runtime, a high-priority 8-GPU job of the same
    team preempts it: the object suspended, its pods deleted by its controller. The high job."""
    for name in make_pods("low"):
        world.fake.run_container(world.namespace, name)
    world.step()
    world.step()
    low.refresh_from_db()
    assert low.state == "running", low.reason
    world.step(400.0)  # past the minimum runtime before a job may be preempted
    spec = job_spec(replicas=1, resources={"gpus": 8}, priority_class="high", max_runtime_s=60)
    high, _ = job_submit(user=world.org.users["alice"], project=world.org.proj_alpha, payload=spec)
    for _ in range(4):
        world.step()
        make_pods("low")  # its controller deletes the pods of a suspended object
    low.refresh_from_db()
    assert low.state in ("queued", "preempted") and low.attempt == 1, (low.state, low.reason)
    return Job.objects.get(pk=high.pk)


def cancel_and_readmit(world: World, high: Job, make_pods: Callable[[str], list[str]]) -> None:
    """Cancel `high`, its kubelet stops its container (the pod gone, its GPUs free), and step
    until "low" is admitted again and its new pods made."""
    job_cancel(user=world.org.users["alice"], job=high)
    world.step()
    world.fake.delete("pods", world.namespace, f"gantry-{high.pk}-a0-r0", 0)
    for _ in range(4):
        world.step()
        make_pods("low")


def test_a_preempted_job_is_suspended_requeued_and_admitted_again_as_a_new_attempt(
    world: World,
) -> None:
    """A low-priority Job holds both nodes; a high-priority job of the same team preempts it:
    the Job is suspended again (its controller deletes its pods), its user told why, and once
    the GPUs are free it is admitted again under a new attempt, with pods bound anew."""
    body = job("low", parallelism=2, gpus=8)
    body["metadata"]["labels"] = {"gantry.io/priority-class": "low"}
    create_job(world, body)
    world.step()
    low = Job.objects.get(spec__workload__kind="Job")
    jobs = JobController(world)
    high = preempt_running(world, low, jobs.step)
    assert world.fake.get("jobs", world.namespace, "low")["spec"]["suspend"] is True
    world.controller.sync()
    preempted = [
        e["message"]
        for e in world.fake.list_objects("events", world.namespace, {})["items"]
        if e["reason"] == "Preempted"
    ]
    assert preempted and "preempted" in preempted[0]
    cancel_and_readmit(world, high, jobs.step)
    again = world.fake.get("jobs", world.namespace, "low")
    assert again["spec"]["suspend"] is False
    assert "gantry.io/attempt" not in again["spec"]["template"]["metadata"]["labels"]
    low.refresh_from_db()
    bound = {
        a.pod_name for a in Allocation.objects.filter(job=low, attempt=1, bound_at__isnull=False)
    }
    assert len(bound) == 2 and all(world.pod(n)["spec"].get("nodeName") for n in bound)


def _count_suspensions(world: World) -> list[str]:
    """The objects the daemon's backend is asked to suspend, from now on, in order."""
    asked: list[str] = []
    suspend = world.backend.suspend_workload

    def counted(namespace: str, workload: str) -> None:
        asked.append(workload)
        suspend(namespace, workload)

    world.backend.suspend_workload = counted  # type: ignore[method-assign]
    return asked


def _low_job_running(world: World) -> tuple[Job, JobController]:
    """A low-priority 2 x 8-GPU Job admitted, its pods made and running, past the minimum
    runtime: the job, and its controller as played."""
    body = job("low", parallelism=2, gpus=8)
    body["metadata"]["labels"] = {"gantry.io/priority-class": "low"}
    create_job(world, body)
    world.step()
    low = Job.objects.get(spec__workload__kind="Job")
    jobs = JobController(world)
    for name in jobs.step("low"):
        world.fake.run_container(world.namespace, name)
    world.step()
    world.step()
    world.step(400.0)  # past the minimum runtime
    return low, jobs


def _submit_high(world: World) -> Job:
    """A high-priority 8-GPU job of the same team, which preempts the low one."""
    spec = job_spec(replicas=1, resources={"gpus": 8}, priority_class="high", max_runtime_s=60)
    high, _ = job_submit(user=world.org.users["alice"], project=world.org.proj_alpha, payload=spec)
    return high


def test_a_preempted_jobs_object_is_suspended_once_while_its_pods_go_and_again_when_preempted_again(
    world: World,
) -> None:
    """Reconcile sees a preempted job's allocations every cycle until its pods are gone, and
    its Job's controller takes its time to delete them: the Job is suspended once, not again at
    every cycle (a call a cycle per preempted job was most of the daemon's time in Kueue's
    scenario). Admitted again and preempted again, it is suspended again."""
    low, jobs = _low_job_running(world)
    high = _submit_high(world)
    asked = _count_suspensions(world)
    for _ in range(5):  # its controller has not deleted the pods yet: they still run
        world.step()
    low.refresh_from_db()
    assert low.state == "preempted", (low.state, low.reason)
    assert world.fake.get("jobs", world.namespace, "low")["spec"]["suspend"] is True
    assert asked == ["jobs/low"]
    jobs.step("low")  # now it does
    world.step()
    cancel_and_readmit(world, Job.objects.get(pk=high.pk), jobs.step)
    assert world.fake.get("jobs", world.namespace, "low")["spec"]["suspend"] is False
    for name in jobs.step("low"):
        world.fake.run_container(world.namespace, name)
    world.step()
    world.step(400.0)
    asked.clear()
    _submit_high(world)
    for _ in range(3):
        world.step()
    assert world.fake.get("jobs", world.namespace, "low")["spec"]["suspend"] is True
    assert asked == ["jobs/low"]


def test_a_suspension_that_failed_is_sent_again_at_the_next_cycle(world: World) -> None:
    """The API server refuses the suspension (every try of the call's retries): the daemon
    does not count the Job as suspended, and the next cycle's reconcile sends it again."""
    low, _ = _low_job_running(world)
    path = f"/apis/batch/v1/namespaces/{world.namespace}/jobs/low$"
    world.fake.inject("500", path, method="PATCH", count=3)  # the client's three tries
    _submit_high(world)
    world.step()
    low.refresh_from_db()
    assert low.state == "preempted", (low.state, low.reason)
    assert world.fake.get("jobs", world.namespace, "low")["spec"]["suspend"] is False
    world.step()
    assert world.fake.get("jobs", world.namespace, "low")["spec"]["suspend"] is True
    asked = _count_suspensions(world)
    world.step()
    assert asked == []  # suspended: not sent again


def test_a_jobs_pod_made_as_it_was_suspended_is_left_to_its_controller(world: World) -> None:
    """The Job controller may make a pod from an admitted Job's template just as Gantry
    preempts the job and suspends the Job: the pod has no allocation. Gantry leaves it to the
    controller, which deletes it once it sees the suspension; deleted by Gantry it would count
    as a failed pod against the Job's backoffLimit (0 here: the Job would fail, podless, while
    its job waits to be admitted again)."""
    body = job("low", parallelism=2, gpus=8, backoffLimit=0)
    body["metadata"]["labels"] = {"gantry.io/priority-class": "low"}
    create_job(world, body)
    world.step()
    low = Job.objects.get(spec__workload__kind="Job")
    assert world.fake.get("jobs", world.namespace, "low")["spec"]["suspend"] is False
    jobs = JobController(world)
    high = preempt_running(world, low, jobs.step)
    assert world.fake.get("jobs", world.namespace, "low")["spec"]["suspend"] is True
    assert not Allocation.objects.filter(job=low, ended_at__isnull=True).exists()
    # the controller's pod of the admitted template, made before it saw the suspension
    template = world.fake.get("jobs", world.namespace, "low")["spec"]["template"]
    late = {
        "metadata": {
            "name": "low-0-late",
            "labels": {
                **template["metadata"]["labels"],
                "batch.kubernetes.io/job-name": "low",
                "batch.kubernetes.io/job-completion-index": "0",
            },
        },
        "spec": copy.deepcopy(template["spec"]),
    }
    world.fake.create("pods", world.namespace, late)
    for _ in range(3):
        world.step()
    assert world.pod("low-0-late") is not None  # not deleted by Gantry
    assert not world.pod("low-0-late")["spec"].get("nodeName")  # nor bound
    assert jobs.step("low") == []  # the controller deletes it
    high.refresh_from_db()
    assert high.state in ("binding", "running"), high.reason


def test_the_api_marks_a_job_created_in_kubernetes_with_its_object(world: World) -> None:
    from rest_framework.test import APIClient

    create_job(world, job("marked", parallelism=1))
    world.controller.sync()
    api = APIClient()
    api.force_authenticate(world.org.users["alice"])
    portal = job_submit(
        user=world.org.users["alice"], project=world.org.proj_alpha, payload=job_spec()
    )[0]
    listed = api.get("/api/v1/jobs/", {"origin": "kubernetes"}).json()["results"]
    (native,) = listed
    assert native["origin"] == {
        "kind": "Job",
        "api_version": "batch/v1",
        "namespace": world.namespace,
        "name": "marked",
        "uid": world.fake.get("jobs", world.namespace, "marked")["metadata"]["uid"],
    }
    ours = api.get("/api/v1/jobs/", {"origin": "gantry"}).json()["results"]
    assert [(j["id"], j["origin"]) for j in ours] == [(portal.pk, None)]
    assert api.get("/api/v1/jobs/", {"origin": "elsewhere"}).status_code == 400


def test_the_portal_marks_a_job_created_in_kubernetes(world: World) -> None:
    from django.test import Client

    create_job(world, job("shown", parallelism=1))
    world.controller.sync()
    native = Job.objects.get(spec__workload__kind="Job")
    browser = Client()
    browser.force_login(world.org.users["alice"])
    page = browser.get(f"/jobs/{native.pk}/").content.decode()
    assert "Kubernetes: Job" in page and f"{world.namespace}/shown" in page
    listing = browser.get("/jobs/").content.decode()
    assert "k8s Job" in listing


def test_a_job_that_completed_while_queued_again_ends_and_frees_its_place(world: World) -> None:
    """Its Job is Complete though Gantry never admitted it (something else ran it): nothing
    is left to run, so its job ends (cancelled, saying why) instead of waiting for pods."""
    create_job(world, job("done", parallelism=1))
    world.controller.sync()
    queued = Job.objects.get(spec__workload__kind="Job")
    finished = world.fake.get("jobs", world.namespace, "done")
    finished["status"] = {"conditions": [{"type": "Complete", "status": "True"}]}
    world.fake.replace("jobs", world.namespace, "done", finished)
    world.controller.sync()
    queued.refresh_from_db()
    assert queued.state == "cancelled"
    assert "its Job is complete in Kubernetes" in queued.events.last().message


def test_a_job_preempted_as_its_pods_finished_succeeds_when_its_job_completes(
    world: World,
) -> None:
    """Its pods finished just as Gantry preempted it: the Job's controller marks it Complete
    while its job waits in the queue again. The work is done, so the job succeeds (not
    cancelled), says why, and holds nothing."""
    body = job("low", parallelism=2, gpus=8)
    body["metadata"]["labels"] = {"gantry.io/priority-class": "low"}
    create_job(world, body)
    world.step()
    low = Job.objects.get(spec__workload__kind="Job")
    preempt_running(world, low, JobController(world).step)
    finished = world.fake.get("jobs", world.namespace, "low")
    finished["status"] = {"conditions": [{"type": "Complete", "status": "True"}]}
    world.fake.replace("jobs", world.namespace, "low", finished)
    world.controller.sync()
    low.refresh_from_db()
    assert low.state == "succeeded", (low.state, low.reason)
    assert "finished before Gantry stopped them" in low.events.last().message
    assert not Allocation.objects.filter(job=low, ended_at__isnull=True).exists()


def test_a_job_that_failed_podless_while_admitted_again_fails_with_its_job(world: World) -> None:
    """Admitted again after a preemption, a Job fails with no pod (its backoffLimit reached:
    a pod deleted at the preemption counted against it) before its controller makes any:
    nothing will come to bind, so its Gantry job, waiting in binding, fails with the Job's
    own reason at once (not at the binding deadline), and its GPUs are freed."""
    body = job("low", parallelism=2, gpus=8, backoffLimit=0)
    body["metadata"]["labels"] = {"gantry.io/priority-class": "low"}
    create_job(world, body)
    world.step()
    low = Job.objects.get(spec__workload__kind="Job")
    high = preempt_running(world, low, JobController(world).step)
    cancel_and_readmit(world, high, lambda _name: [])  # admitted again; no pod comes
    low.refresh_from_db()
    assert (low.state, low.attempt) == ("binding", 1), low.reason
    failed = world.fake.get("jobs", world.namespace, "low")
    message = "Job has reached the specified backoff limit"
    condition = {
        "type": "Failed",
        "status": "True",
        "reason": "BackoffLimitExceeded",
        "message": message,
    }
    failed["status"] = {"failed": 1, "active": 0, "conditions": [condition]}
    world.fake.replace("jobs", world.namespace, "low", failed)
    world.step()  # well within the binding deadline (600 s)
    low.refresh_from_db()
    assert low.state == "failed", low.reason
    assert low.reason == f"its Job failed in Kubernetes: {message}"
    world.step()
    world.step()
    assert not Allocation.objects.filter(job=low, ended_at__isnull=True).exists()
    spec = job_spec(replicas=2, resources={"gpus": 8})
    after, _ = job_submit(user=world.org.users["alice"], project=world.org.proj_alpha, payload=spec)
    world.step()
    after.refresh_from_db()
    assert after.state in ("admitted", "binding"), after.reason  # the GPUs were freed


def test_a_job_whose_pods_were_adopted_is_left_to_the_daemon_when_it_fails(
    world: World,
) -> None:
    """A Job whose pods Gantry adopted and bound reports Failed: its job's end is read from
    its pods by the daemon (they say why, and may still be running), not from the Job."""
    create_job(world, job("mine", parallelism=1))
    world.step()
    names = JobController(world).step("mine")
    world.step()
    mirrored_job = Job.objects.get(spec__workload__kind="Job")
    assert mirrored_job.state == "binding", mirrored_job.reason
    failed = world.fake.get("jobs", world.namespace, "mine")
    failed["status"] = {"conditions": [{"type": "Failed", "status": "True", "message": "x"}]}
    world.fake.replace("jobs", world.namespace, "mine", failed)
    world.controller.sync()
    mirrored_job.refresh_from_db()
    assert mirrored_job.state == "binding"
    assert world.pod(names[0])["spec"].get("nodeName")


def test_a_job_cancelled_before_its_jobs_pods_come_frees_its_gpus(world: World) -> None:
    """Cancelled in the portal while it waits in binding for its Job's pods: no pod will
    come, so its replicas' allocations are released (and the Job suspended), not held."""
    create_job(world, job("slow", parallelism=2, gpus=8))
    world.step()
    slow = Job.objects.get(spec__workload__kind="Job")
    assert slow.state == "binding", slow.reason
    job_cancel(user=world.org.users["alice"], job=slow)
    world.step()
    world.step()
    assert not Allocation.objects.filter(job=slow, ended_at__isnull=True).exists()
    assert world.fake.get("jobs", world.namespace, "slow")["spec"]["suspend"] is True


def test_a_running_job_whose_object_failed_fails_with_it_not_requeued_as_node_lost(
    world: World,
) -> None:
    """A Job of two pods runs; one pod fails and the Job's backoffLimit (0) is reached: its
    controller marks the Job Failed and deletes the pod still running. The Gantry job fails
    with the Job's reason; the pod gone is not read as lost with its node (the attempt was
    requeued, then cancelled as if its pods had finished before Gantry stopped them)."""
    names = run_job(world, job("ddp", parallelism=2, backoffLimit=0))
    mine = Job.objects.get(spec__workload__kind="Job")
    assert mine.state == "running", mine.reason
    world.fake.set_pod_status(world.namespace, names[1], {"phase": "Failed"})
    failed = world.fake.get("jobs", world.namespace, "ddp")
    message = "Job has reached the specified backoff limit"
    condition = {"type": "Failed", "status": "True", "reason": "BackoffLimitExceeded"}
    failed["status"] = {"failed": 1, "active": 0, "conditions": [{**condition, "message": message}]}
    world.fake.replace("jobs", world.namespace, "ddp", failed)
    world.fake.delete("pods", world.namespace, names[0], 0)  # the active pod, deleted
    world.step()
    world.step()
    mine.refresh_from_db()
    assert (mine.state, mine.attempt) == ("failed", 0), mine.reason
    assert mine.reason == f"its Job failed in Kubernetes: {message}"
    world.step()
    assert not Allocation.objects.filter(job=mine, ended_at__isnull=True).exists()


def test_class_values_read_the_label_else_the_default_for_the_job_type(world: World) -> None:
    ns = world.namespace
    labelled = {"metadata": {"namespace": ns, "labels": {"gantry.io/priority-class": "high"}}}
    unknown = {"metadata": {"namespace": ns, "labels": {"gantry.io/priority-class": "nope"}}}
    batch = {"metadata": {"namespace": ns, "labels": {}}, "spec": {"parallelism": 1}}
    training = {"metadata": {"namespace": ns, "labels": {}}, "spec": {"parallelism": 2}}
    elsewhere = {"metadata": {"namespace": "not-gantrys", "labels": {}}, "spec": {}}
    value = order.class_values([labelled, unknown, batch, training, elsewhere])
    assert [value(o) for o in (labelled, unknown, batch, training, elsewhere)] == [
        800,  # high
        order.LOWEST,  # a class no one has: its submission refuses it
        200,  # batch: low, the platform's default
        500,  # training: normal
        order.LOWEST,  # no project's namespace
    ]


def test_a_burst_found_in_one_pass_is_queued_highest_class_first(world: World) -> None:
    """Three Jobs created at once, the high one last: one pass queues it first (the jobs'
    ids say the order of their submissions)."""
    for name, labels in (
        ("first-low", {"gantry.io/priority-class": "low"}),
        ("second-default", {}),  # a training Job: normal
        ("last-high", {"gantry.io/priority-class": "high"}),
    ):
        body = job(name)
        body["metadata"]["labels"] = labels
        create_job(world, body)
    world.controller.sync()
    names = list(Job.objects.order_by("id").values_list("name", flat=True))
    assert names == ["last-high", "second-default", "first-low"]


def test_a_pass_queues_for_its_budget_then_a_later_higher_class_goes_before_the_rest(
    world: World,
) -> None:
    """A burst longer than a pass's queueing budget is queued over several passes, each
    listing again: a high Job created after the burst is queued before the burst's rest (in
    one pass it came after all of it). Each submission here takes 0.4 s of the controller's
    clock; the budget is 1 s."""
    now = [0.0]
    world.controller.monotonic = lambda: now[0]
    real = controller_module.mirror_object

    def slow(*args: Any, **kwargs: Any) -> Any:
        now[0] += 0.4
        return real(*args, **kwargs)

    for i in range(5):
        body = job(f"low-{i}")
        body["metadata"]["labels"] = {"gantry.io/priority-class": "low"}
        create_job(world, body)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(controller_module, "mirror_object", slow)
        stats = world.controller.sync()  # 0.4, 0.8, then 1.2: the budget is spent
        assert (stats.mirrored, stats.deferred) == (3, 2)
        high = job("late-high")
        high["metadata"]["labels"] = {"gantry.io/priority-class": "high"}
        create_job(world, high)
        stats = world.controller.sync()
        assert (stats.mirrored, stats.deferred) == (3, 0)
    names = list(Job.objects.order_by("id").values_list("name", flat=True))
    assert names == ["low-0", "low-1", "low-2", "late-high", "low-3", "low-4"]
    assert world.controller.sync().deferred == 0  # nothing new: nothing left


def test_a_pass_queues_one_workload_at_least_whatever_its_budget(world: World) -> None:
    world.controller.queueing_budget_s = 0.0
    for i in range(2):
        create_job(world, job(f"slowest-{i}"))
    first = world.controller.sync()
    assert (first.mirrored, first.deferred) == (1, 1)
    second = world.controller.sync()
    assert (second.mirrored, second.deferred) == (1, 0)


def test_in_the_background_a_pass_does_not_wait_for_a_stalled_tell_and_each_objects_tells_keep_their_order(  # noqa: E501
    world: World,
) -> None:
    """The deployed loop tells in the background: a pass whose event call hangs (3 s here)
    returns without waiting for it, and the object's later tells land after it, in order;
    `close` waits for what is under way."""
    world.controller.background_tells = True
    create_job(world, job("told"))
    world.fake.inject("timeout", "/events$", method="POST", delay_s=3.0, count=1)
    started = time.monotonic()
    world.controller.sync()  # queued: its "Queued" event hangs
    assert time.monotonic() - started < 2.5, "the pass waited for its tell"
    job_cancel(user=world.org.users["alice"], job=_job_named("told"), reason="")
    world.controller.sync()  # "Cancelled", behind "Queued" on the object's lane
    world.controller.close()
    assert "Cancelled" in [r for r, _ in world.events("told")]
    annotations = world.fake.get("jobs", world.namespace, "told")["metadata"]["annotations"]
    assert annotations[status.ANNOTATION_STATUS] == "Cancelled", "an older tell landed last"


def test_in_the_background_an_objects_tells_made_while_its_lane_is_busy_are_written_together(
    world: World,
) -> None:
    """While an object's first tell hangs (3 s), its job's reason changes twice and it is
    cancelled: its lane then writes what was made meanwhile at once: the waiting reason only
    as it is now (the one before it is out of date), the cancellation, and the status
    annotations once. A slow API server gets fewer calls, not a longer backlog."""
    world.controller.background_tells = True
    create_job(world, job("told"))
    world.fake.inject("timeout", "/events$", method="POST", delay_s=3.0, count=1)
    world.controller.sync()  # queued: its "Queued" event hangs
    queued = _job_named("told")
    for reason in ("quota: team nlp uses 40 of 40 gpu", "quota: team nlp uses 38 of 40 gpu"):
        Job.objects.filter(pk=queued.pk).update(reason=reason)
        world.controller.sync()
    job_cancel(user=world.org.users["alice"], job=queued, reason="")
    world.controller.sync()
    world.fake.requests.clear()
    world.controller.close()
    told = world.events("told")  # in the fake's order, not the order written
    assert sorted(r for r, _ in told) == ["Cancelled", "Queued", "Queued"], told
    queued = sorted(m for r, m in told if r == "Queued")
    assert "38 of 40" in queued[0] and "waiting for its turn" in queued[1], told
    assert not any("40 of 40" in m for _, m in told)
    path = f"/apis/batch/v1/namespaces/{world.namespace}/jobs/told"
    annotated = [m for m, at in world.fake.requests if m == "PATCH" and at == path]
    assert len(annotated) == 2  # the first tell's, then the three made meanwhile's once
    annotations = world.fake.get("jobs", world.namespace, "told")["metadata"]["annotations"]
    assert annotations[status.ANNOTATION_STATUS] == "Cancelled"


def _job_named(name: str) -> Job:
    return Job.objects.get(name=name)


def test_a_pass_reads_the_platforms_configuration_once_for_all_its_submissions(
    world: World,
) -> None:
    """Five Jobs queued in one pass read the approval policies, the registries, the nodes'
    inventory, the submitting user and the project once (common/db/shared_reads), not once or
    twice per submission; what the submissions change (the jobs) is read for each."""
    for i in range(5):
        create_job(world, job(f"batch-{i}"))
    with CaptureQueriesContext(connection) as queries:
        assert world.controller.sync().mirrored == 5

    def reads(table: str) -> int:
        """The reads whose first FROM is `table` (a subquery's is another read's)."""
        return sum(
            q["sql"].startswith("SELECT")
            and q["sql"].split(" FROM ", 1)[1].startswith(f'"{table}"')
            for q in queries.captured_queries
        )

    assert reads("tenants_approvalpolicy") == 1
    assert reads("scheduler_node") == 1
    assert reads("auth_user") == 1
    assert reads("tenants_project") == 2  # the pass's queue order reads it too
    # the queue order's and the submissions' lookups, two queries each (not two a submission)
    assert reads("tenants_prioritydefault") == 4
    assert reads("scheduler_job") >= 5  # each submission still looks for its own job


def test_a_mirrored_submission_makes_few_round_trips_to_the_database(world: World) -> None:
    """The door's cost on the Kubernetes-native path (issue 37): a submission made 12
    statements (and 6 savepoints), and the controller queues at most as fast as they return.
    Now a pass looks up the jobs of all it found in one read; a job is inserted with its
    workload (no second write, no outer transaction), its reservation is one insert (no
    lookup and savepoint), the rate cards are read once a pass, and the budgets once a job
    when there is none to lock: 6 statements, whose 4 writes are the job, its event, its
    reservation and its audit entry."""
    for i in range(5):
        create_job(world, job(f"batch-{i}"))
    with CaptureQueriesContext(connection) as queries:
        assert world.controller.sync().mirrored == 5
    statements = [
        q["sql"]
        for q in queries.captured_queries
        if not q["sql"].startswith(("SAVEPOINT", "RELEASE SAVEPOINT"))
    ]
    ends = [i for i, sql in enumerate(statements) if sql.startswith('INSERT INTO "tenants_audit')]
    assert len(ends) == 5
    # each submission after the first (whose shared reads serve the pass): from the end of
    # the one before to its own audit entry
    for before, end in itertools.pairwise(ends):
        made = statements[before + 1 : end + 1]
        writes = [
            sql.split(" (", 1)[0].replace(" OR IGNORE", "")  # SQLite's ON CONFLICT DO NOTHING
            for sql in made
            if not sql.startswith("SELECT")
        ]
        assert len(made) == 6, made
        assert writes == [
            'INSERT INTO "scheduler_job"',
            'INSERT INTO "scheduler_jobevent"',
            'INSERT INTO "billing_budgetreservation"',
            'INSERT INTO "tenants_auditentry"',
        ]
    assert sum('FROM "billing_ratecard"' in sql for sql in statements) == 1


def test_admitted_then_binding_is_told_once_not_twice_word_for_word(world: World) -> None:
    """Admitted and binding are both told `Admitted`, with one message: a pass that saw the
    job admitted and the next that saw it binding wrote that event twice (on the real plane,
    every Job's `kubectl describe` listed the same Admitted line two times)."""
    create_job(world, job("told", parallelism=1))
    world.controller.sync()
    queued = Job.objects.get(spec__workload__kind="Job")
    for state in ("admitted", "binding", "running"):
        Job.objects.filter(pk=queued.pk).update(state=state)
        world.controller.sync()
    told = sorted(reason for reason, _ in world.events("told"))
    assert told == ["Admitted", "Queued", "Running"]  # each once


def test_a_refusal_whose_reason_ends_its_sentence_reads_with_one_full_stop(world: World) -> None:
    """The job spec's errors end with a full stop ("known classes: ... best-effort."): the
    refusal read "best-effort.. It stays held until fixed." in `kubectl describe`."""
    classless = job("classless", parallelism=1)
    classless["metadata"]["labels"] = {"gantry.io/priority-class": "urgent"}
    create_job(world, classless)
    world.controller.sync()
    ((reason, message),) = world.events("classless")
    assert reason == "Refused" and "'urgent'" in message
    assert ".." not in message and message.endswith(". It stays held until fixed.")


def test_a_queued_objects_annotation_shows_its_place_and_start_as_they_move(world: World) -> None:
    """`kubectl get` shows where a waiting Job stands (issue 37): its Queued event is told
    before the daemon's first estimate; the estimate, when it comes, and each later change
    of place are written to the status annotation (no event each: `kubectl describe` would
    fill with them), at most once a minute per object."""
    now = [1000.0]
    world.controller.monotonic = lambda: now[0]
    create_job(world, job("waits"))
    world.controller.sync()
    queued = _job_named("waits")
    assert queued.state == "queued"

    def annotation() -> str:
        obj = world.fake.get("jobs", world.namespace, "waits")
        return str(obj["metadata"]["annotations"][status.ANNOTATION_REASON])

    assert "Position" not in annotation()  # no estimate yet
    start = timezone.now().replace(second=0, microsecond=0) + timedelta(minutes=30)
    estimate = JobQueueEstimate.objects.create(
        job=queued,
        position_tenant=3,
        position_cluster=7,
        eta_p50=start,
        eta_p90=start + timedelta(minutes=20),
        estimated_at=timezone.now(),
        computed_at=timezone.now(),
    )
    world.controller.sync()
    shown = f"Position 3 in the team's queue, estimated start {start:%Y-%m-%d %H:%M} UTC."
    assert shown in annotation()
    estimate.position_tenant, estimate.eta_p50 = 2, start - timedelta(minutes=10)
    estimate.save()
    now[0] += 30.0
    world.controller.sync()
    assert shown in annotation()  # within the minute: not written again
    now[0] += 31.0
    world.controller.sync()
    moved = f"Position 2 in the team's queue, estimated start {start - timedelta(minutes=10):%H:%M}"
    assert moved.split(", estimated start ")[0] in annotation()
    assert f"{start - timedelta(minutes=10):%H:%M} UTC" in annotation()
    queued_events = [m for r, m in world.events("waits") if r == "Queued"]
    assert len(queued_events) == 1 and "Position" not in queued_events[0]
    assert world.events("waits") == [("Queued", queued_events[0])]


def test_places_are_rewritten_at_a_bounded_rate_those_never_shown_first() -> None:
    """A long queue's places move at every admission ahead: at most PLACES_BURST rewrites at
    once, then PLACES_PER_S a second, the jobs never shown a place before those shown longest."""
    now = [0.0]
    teller = WorkloadController(cluster=None, monotonic=lambda: now[0])  # type: ignore[arg-type]
    shown_long_ago = {f"old-{i}": ((1, "x"), -500.0 + i) for i in range(10)}
    teller.placed.update(shown_long_ago)
    queued = [(i, f"new-{i}", (i, "")) for i in range(60)]
    queued += [(100 + i, f"old-{i}", (2, "y")) for i in range(10)]
    first = teller._moves(queued)
    assert first == set(range(controller_module.PLACES_BURST))  # never shown, in order
    now[0] += 1.0
    second = teller._moves([q for q in queued if q[0] not in first])
    assert len(second) == int(controller_module.PLACES_PER_S)
    assert second == {50, 51, 52, 53, 54}
    teller.placed.update({f"new-{i}": ((i, ""), 0.0) for i in range(60)})
    now[0] += 100.0  # the allowance is full again; the old ones, shown longest ago, first
    third = teller._moves(queued)
    assert third == set(range(100, 110))  # the new ones' places have not moved


def test_a_refused_workload_is_tried_again_when_it_changes_or_after_a_while_not_every_pass(
    world: World,
) -> None:
    """A Job Gantry cannot queue (an unknown priority class) is told once and tried again
    when the user changes it, or after REFUSED_RETRY_S (an admin may make the class): not at
    every pass, each a whole submission, and each logged as a refusal (it was, every 2 s)."""
    now = [0.0]
    world.controller.monotonic = lambda: now[0]
    tries = []
    real = controller_module.mirror_object

    def counted(*args: Any, **kwargs: Any) -> Any:
        tries.append(now[0])
        return real(*args, **kwargs)

    body = job("urgent")
    body["metadata"]["labels"] = {"gantry.io/priority-class": "urgent"}
    create_job(world, body)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(controller_module, "mirror_object", counted)
        assert world.controller.sync().refused == 1
        now[0] += 2.0
        assert world.controller.sync().refused == 0  # not tried, nor counted again
        assert len(tries) == 1
        obj = world.fake.get("jobs", world.namespace, "urgent")
        obj["metadata"]["labels"]["gantry.io/priority-class"] = "nope"
        world.fake.replace("jobs", world.namespace, "urgent", obj)
        assert world.controller.sync().refused == 1  # changed: tried, a new reason told
        assert len(tries) == 2
        now[0] += controller_module.REFUSED_RETRY_S
        world.controller.sync()  # unchanged, but long enough: tried again
        assert len(tries) == 3
    refused = [m for r, m in world.events("urgent") if r == "Refused"]
    assert len(refused) == 2  # in the fake's order, not the order written
    assert {"'urgent'", "'nope'"} == {w for m in refused for w in ("'urgent'", "'nope'") if w in m}
    # in the object's terms: the label the user set, not the job spec's field
    assert all("the label gantry.io/priority-class: unknown priority class" in m for m in refused)
    assert not any("priority_class" in m for m in refused)
    assert not Job.objects.filter(name="urgent").exists()


def test_every_projects_namespace_is_made_before_its_first_pod(
    world: World, caplog: pytest.LogCaptureFixture
) -> None:
    """A Kubernetes user creates workloads in their project's namespace, so it must exist
    before any job of theirs ran (it was made with a job's first pod only, and the QA run
    found a platform engineer making it by hand). The daemon's node sync makes each project's
    namespace as Gantry's (labelled, restricted), once; one another group made is left
    alone, and said once."""
    org = world.org
    foreign = org.proj_bravo.namespace
    world.fake.add_namespace(foreign)  # another group's, assigned to the project by mistake
    world.daemon.step()
    made_here = Project.objects.exclude(namespace__in=[foreign, world.namespace])
    assert made_here.exists()
    for project in made_here:
        made = world.fake.get("namespaces", "", project.namespace)
        assert made is not None, project.namespace
        labels = made["metadata"]["labels"]
        assert labels["app.kubernetes.io/managed-by"] == "gantry"
        assert labels["pod-security.kubernetes.io/enforce"] == "restricted"
    assert world.fake.get("namespaces", "", foreign)["metadata"]["labels"] == {}
    said = [r.getMessage() for r in caplog.records if foreign in r.getMessage()]
    assert len(said) == 1 and "not created by Gantry" in said[0]
    world.fake.requests.clear()
    world.clock.advance(3600.0)  # the next node sync
    world.daemon.step()
    asked = [at for method, at in world.fake.requests if "/namespaces/" in at and "pods" not in at]
    assert [a for a in asked if a.endswith(f"/namespaces/{foreign}")] == [
        f"/api/v1/namespaces/{foreign}"
    ]  # only the foreign one is looked at again (it may be assigned meanwhile)
    assert len([r for r in caplog.records if foreign in r.getMessage()]) == 1


def test_a_sync_makes_a_bounded_number_of_namespaces_the_foreign_ones_last(world: World) -> None:
    """A new leader of an installation with many projects makes their namespaces over several
    syncs (each is several calls), not all before its first cycle; a namespace another group
    holds does not take a turn from one still to make."""
    from scheduler.daemon.namespaces import prepare_namespaces

    foreign = world.org.proj_bravo.namespace
    world.fake.add_namespace(foreign)
    assert world.daemon.lease.acquire()  # the daemon's writes to the cluster are fenced
    world.daemon.keeper.mark_renewed()
    ready: set[str] = set()
    refused = {foreign}  # refused at an earlier try
    wanted = set(Project.objects.values_list("namespace", flat=True))
    made = [prepare_namespaces(world.daemon.cluster, ready, refused, per_sync=1)]
    assert made == [1] and len(ready) == 1
    while len(ready) < len(wanted) - 1:
        made.append(prepare_namespaces(world.daemon.cluster, ready, refused, per_sync=1))
    assert set(made) == {1} and ready == wanted - {foreign}
    assert prepare_namespaces(world.daemon.cluster, ready, refused, per_sync=1) == 0


def test_passes_within_a_few_seconds_share_their_reads_of_the_configuration(world: World) -> None:
    """Jobs created at a steady rate come one a pass: each pass read the approval policies,
    the nodes' inventory, the user and the project again for its one submission. Passes
    within SHARED_READS_S share them; the first pass after reads them again."""
    clock = [0.0]
    world.controller.monotonic = lambda: clock[0]

    def policies_read_by_a_pass_with_one_new_job(name: str) -> int:
        create_job(world, job(name))
        with CaptureQueriesContext(connection) as queries:
            assert world.controller.sync().mirrored == 1
        return sum('FROM "tenants_approvalpolicy"' in q["sql"] for q in queries.captured_queries)

    assert policies_read_by_a_pass_with_one_new_job("first") == 1
    clock[0] += controller_module.SHARED_READS_S / 2
    assert policies_read_by_a_pass_with_one_new_job("second") == 0
    clock[0] += controller_module.SHARED_READS_S
    assert policies_read_by_a_pass_with_one_new_job("third") == 1
