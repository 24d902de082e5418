"""Restarts during admission (issue 37): the daemon, the workload controller and the webhook
restarted at each point of a workload's admission double-admit nothing and lose nothing.

A crash is played as the daemon's own tests play it (tests/daemon/test_faults.py): an
exception raised at a point of the cycle (a hook, or a call to the API server), then a fresh
daemon, on a fresh client, on the same database, once the dead one's lease has expired.
After every step the promises are checked (`assert_admitted_once`):
- one Gantry job per object (its uid), one active allocation per replica, no pod bound by
  two binds, every pod on the node its allocation names;
- a Job is never unsuspended unless its Gantry job is live (admitted, binding, running or
  succeeded), once a reconcile has run since the restart;
- nothing lost: every held object ends queued or admitted.
Over the fake API server, with the daemon on a fake clock.
"""

from __future__ import annotations

import json
import threading
import time
from collections import Counter
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from scheduler.backends.kubernetes.backend import KubernetesBackend
from scheduler.daemon.loop import Daemon
from scheduler.jobs import services as job_services
from scheduler.leader import Lease
from scheduler.models import Allocation, Job
from scheduler.workloads.controller import WorkloadController
from scheduler.workloads.mutate import GATE
from tests.daemon.conftest import Killed, expire_leases
from tests.k8s.conftest import api_client_for
from tests.k8s.fake_admission import FakeWebhook
from tests.workloads.test_controller import JobController, World, create_job, job, pod, world

__all__ = ["world"]  # the fixture, shared with test_controller

Obj = dict[str, Any]
LIVE = ("admitted", "binding", "running", "succeeded")


def _raise() -> None:
    raise Killed


def restart_daemon(world: World, hooks: dict[str, Callable[[], None]] | None = None) -> Daemon:
    """A new daemon process: its own client and backend, the dead one's lease expired."""
    world.api = api_client_for(world.fake.url)
    world.backend = KubernetesBackend(
        world.api, world.backend.config, policy=world.backend.policy, sleep=lambda _s: None
    )
    expire_leases()
    holder = f"fake-k8s-{id(world.backend)}"
    world.daemon = Daemon(
        world.backend,
        lease=Lease(holder, ttl_s=30),
        clock=world.clock,
        sleep=lambda _s: None,
        hooks=hooks,
    )
    return world.daemon


def crash_on_bind(world: World, after: int) -> Counter[str]:
    """The daemon's process dies in its `after + 1`-th bind call (the earlier ones answered);
    returns the binds it sent. The calls may come from the call pool's threads at once: which
    is the `after + 1`-th is decided under a lock."""
    sent: Counter[str] = Counter()
    real = world.backend.bind_pod
    lock = threading.Lock()

    def bind(namespace: str, name: str, node: str) -> None:
        with lock:
            if sum(sent.values()) >= after:
                raise Killed
            sent[name] += 1
        real(namespace, name, node)

    world.backend.bind_pod = bind  # type: ignore[method-assign]
    return sent


def binds(world: World) -> Counter[str]:
    """The pods/binding calls the API server answered, per pod."""
    return Counter(
        path.split("/")[-2]
        for method, path in world.fake.requests
        if method == "POST" and path.endswith("/binding")
    )


def held_jobs(world: World) -> list[Obj]:
    return list(world.fake.list_objects("jobs", world.namespace, {})["items"])


def gantry_jobs() -> dict[str, list[Job]]:
    """Gantry's jobs of workloads, by the workload's uid (read in Python for SQLite)."""
    out: dict[str, list[Job]] = {}
    for j in Job.objects.filter(spec__workload__isnull=False):
        out.setdefault(j.spec["workload"]["uid"], []).append(j)
    return out


def assert_admitted_once(world: World, *, reconciled: bool = True) -> None:
    jobs = gantry_jobs()
    assert all(len(found) == 1 for found in jobs.values()), "a second Gantry job for an object"
    # One active allocation per replica of each job's current attempt, each on its own pod.
    active = list(Allocation.objects.filter(ended_at__isnull=True).select_related("job", "node"))
    per_replica = Counter((a.job_id, a.attempt, a.replica) for a in active)
    assert max(per_replica.values(), default=1) == 1, per_replica
    assert all(a.attempt == a.job.attempt for a in active if a.end_reason == "")
    names = Counter(a.pod_name for a in active)
    assert max(names.values(), default=1) == 1, names
    assert max(binds(world).values(), default=1) == 1, binds(world)
    for a in active:
        placed = world.pod(a.pod_name)
        if placed is not None and placed["spec"].get("nodeName"):
            assert placed["spec"]["nodeName"] == a.node.name, (a.pod_name, a.node.name)
    if reconciled:
        for obj in held_jobs(world):
            if obj["spec"].get("suspend") is False:
                (mine,) = jobs[obj["metadata"]["uid"]]
                assert mine.state in LIVE, (obj["metadata"]["name"], mine.state, mine.reason)


def assert_nothing_lost(world: World) -> None:
    jobs = gantry_jobs()
    uids = [o["metadata"]["uid"] for o in held_jobs(world)]
    for uid in uids:
        assert uid in jobs, "a held Job with no Gantry job"
        assert jobs[uid][0].state in ("queued", *LIVE), (jobs[uid][0].state, jobs[uid][0].reason)


def run(world: World, jobs: JobController, names: list[str], cycles: int) -> None:
    """`cycles` of the controller, the daemon and the Job controller, checking the promises
    after each."""
    for _ in range(cycles):
        world.step()
        for name in names:
            jobs.step(name)
        assert_admitted_once(world)


def running(world: World, jobs: JobController, name: str) -> Job:
    """Run the Job's pods as their kubelets would; its Gantry job as it then stands."""
    for pod_name in jobs.step(name):
        if world.pod(pod_name)["spec"].get("nodeName"):
            world.fake.run_container(world.namespace, pod_name)
    world.step()
    world.step()
    (found,) = gantry_jobs()[world.fake.get("jobs", world.namespace, name)["metadata"]["uid"]]
    return found


# -- (a) the daemon dies after admitting, before committing ---------------------------------


@pytest.mark.parametrize("point", ["pods_created", "bound", "before_commit"])
@pytest.mark.parametrize("pods_made", [True, False], ids=["pods-made", "no-pods-yet"])
def test_a_job_unsuspended_by_a_daemon_that_died_before_committing(
    world: World, point: str, pods_made: bool
) -> None:
    """The Job was unsuspended, the claim not committed (admitted, stand-in pod names). Its
    controller may or may not have made the pods before the next daemon runs: either the new
    daemon adopts and binds them, or it suspends the Job again and requeues its job; never
    an unsuspended Job whose job is queued."""
    create_job(world, job("train", parallelism=2))
    world.controller.sync()
    world.daemon.hooks = {point: _raise}
    world.clock.advance(1)
    with pytest.raises(Killed):
        world.daemon.step()
    assert world.fake.get("jobs", world.namespace, "train")["spec"]["suspend"] is False
    jobs = JobController(world)
    if pods_made:
        jobs.step("train")
    restart_daemon(world)
    world.step()
    assert_admitted_once(world)
    run(world, jobs, ["train"], 4)
    mine = running(world, jobs, "train")
    assert mine.state == "running", (mine.state, mine.reason)
    assert_admitted_once(world)
    assert_nothing_lost(world)


def test_a_job_left_unsuspended_with_a_queued_job_is_suspended_by_the_next_reconcile(
    world: World,
) -> None:
    """However it came about (the suspension after a released claim failed, a crash between
    the two), a held Job unsuspended while its Gantry job is not live is suspended by the
    next reconcile, not left for its job to be placed again."""
    create_job(world, job("stray", parallelism=1))
    world.controller.sync()
    (mine,) = gantry_jobs()[world.fake.get("jobs", world.namespace, "stray")["metadata"]["uid"]]
    # Held back from placement (a backoff), so that only reconcile acts on it.
    Job.objects.filter(pk=mine.pk).update(not_before=world.daemon.now_dt() + timedelta(hours=1))
    world.fake.mutate("jobs", world.namespace, "stray", lambda o: o["spec"].update(suspend=False))
    restart_daemon(world)
    world.clock.advance(1)
    world.daemon.step()
    assert world.fake.get("jobs", world.namespace, "stray")["spec"]["suspend"] is True
    assert_admitted_once(world)
    assert_nothing_lost(world)


def test_a_pod_ungated_by_a_daemon_that_died_before_binding_it(world: World) -> None:
    """The held pod's gate was removed, then the daemon died in its bind: the next daemon
    binds it to the node its allocation names, once."""
    world.create(pod("solo"))
    world.controller.sync()
    crash_on_bind(world, after=0)
    world.clock.advance(1)
    with pytest.raises(Killed):
        world.daemon.step()
    assert not world.pod("solo")["spec"].get("schedulingGates")
    assert not world.pod("solo")["spec"].get("nodeName")
    restart_daemon(world)
    for _ in range(3):
        world.step()
        assert_admitted_once(world)
    (alloc,) = Allocation.objects.filter(ended_at__isnull=True)
    assert world.pod("solo")["spec"]["nodeName"] == alloc.node.name
    assert binds(world) == Counter({"solo": 1})


# -- (b) after committing, before binding ---------------------------------------------------


def test_a_job_committed_by_a_daemon_that_died_before_binding_its_pods(world: World) -> None:
    """The claim is committed (binding) and the daemon dies before any reconcile binds the
    Job's pods: the next daemon adopts and binds each once."""
    create_job(world, job("train", parallelism=2))
    world.step()
    (mine,) = gantry_jobs().values()
    assert mine[0].state == "binding"
    jobs = JobController(world)
    names = jobs.step("train")
    restart_daemon(world)  # the process died between its cycles
    run(world, jobs, ["train"], 2)
    assert binds(world) == Counter(dict.fromkeys(names, 1))
    assert running(world, jobs, "train").state == "running"


# -- (c) mid-bind of a multi-pod Job ---------------------------------------------------------


def test_a_daemon_that_died_mid_bind_of_a_jobs_pods(world: World) -> None:
    create_job(world, job("wide", parallelism=2))
    world.step()
    jobs = JobController(world)
    names = jobs.step("wide")
    crash_on_bind(world, after=1)
    world.clock.advance(1)
    with pytest.raises(Killed):
        world.daemon.step()
    # The pods go out at once: the bind answered may land just after the one that killed it.
    bound: list[str] = []
    for _ in range(100):
        if bound := [n for n in names if world.pod(n)["spec"].get("nodeName")]:
            break
        time.sleep(0.05)
    assert len(bound) == 1, "one pod bound, one not, when the daemon died"
    restart_daemon(world)
    run(world, jobs, ["wide"], 2)
    assert binds(world) == Counter(dict.fromkeys(names, 1))
    assert running(world, jobs, "wide").state == "running"


def test_a_daemon_that_died_mid_bind_of_a_pod_group(world: World) -> None:
    group = {"gantry.io/pod-group": "ddp", "gantry.io/pod-group-size": "2"}
    for name in ("ddp-0", "ddp-1"):
        world.create(pod(name, **group))
    world.controller.sync()
    crash_on_bind(world, after=1)
    world.clock.advance(1)
    with pytest.raises(Killed):
        world.daemon.step()
    restart_daemon(world)
    for _ in range(3):
        world.step()
        assert_admitted_once(world)
    nodes = {n: world.pod(n)["spec"].get("nodeName") for n in ("ddp-0", "ddp-1")}
    assert None not in nodes.values(), nodes
    assert binds(world) == Counter({"ddp-0": 1, "ddp-1": 1})
    (mine,) = gantry_jobs().values()
    assert mine[0].state == "binding" and mine[0].attempt == 0


# -- (d) the controller restarts -------------------------------------------------------------


def test_a_controller_that_died_after_submitting_before_telling_queues_once(
    world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The job was submitted (committed), the controller died before it told the user: the
    next controller finds it by the object's uid, queues nothing twice, and tells the user
    it is queued, once."""
    create_job(world, job("once", parallelism=1))
    monkeypatch.setattr(WorkloadController, "_report", lambda self, stats: _raise())
    with pytest.raises(Killed):
        world.controller.sync()
    monkeypatch.undo()
    assert [len(v) for v in gantry_jobs().values()] == [1]
    assert not world.fake.list_objects("events", world.namespace, {})["items"]
    world.controller = WorkloadController(world.backend)
    world.controller.sync()
    world.controller.sync()
    assert [len(v) for v in gantry_jobs().values()] == [1]
    assert events(world) == ["Queued"]
    run(world, JobController(world), ["once"], 2)
    assert_nothing_lost(world)


def test_a_controller_that_died_inside_the_submission_queues_once(
    world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Killed inside the submission's transaction (its last write, the audit entry, made):
    nothing was committed; the next controller submits it, once."""
    create_job(world, job("inside", parallelism=1))
    real = job_services.audit_record

    def written_then_killed(**kwargs: Any) -> Any:
        real(**kwargs)
        assert Job.objects.filter(spec__workload__name="inside").exists()  # in its transaction
        raise Killed

    monkeypatch.setattr(job_services, "audit_record", written_then_killed)
    with pytest.raises(Killed):
        world.controller.sync()
    monkeypatch.undo()
    assert not gantry_jobs()
    world.controller = WorkloadController(world.backend)
    world.controller.sync()
    assert [len(v) for v in gantry_jobs().values()] == [1]
    assert events(world) == ["Queued"]


def test_a_restarted_controller_does_not_tell_again_what_the_object_shows(
    world: World,
) -> None:
    """Restarted after it told the user (the event, and the status on the object), the
    controller tells nothing twice; the next change it tells, once."""
    create_job(world, job("shown", parallelism=1))
    world.controller.sync()
    assert events(world) == ["Queued"]
    world.controller = WorkloadController(world.backend)  # the process restarted
    world.controller.sync()
    assert events(world) == ["Queued"], "told again after a restart"
    world.step()
    world.controller = WorkloadController(world.backend)
    world.controller.sync()
    assert sorted(events(world)) == ["Admitted", "Queued"]


def events(world: World) -> list[str]:
    return [e["reason"] for e in world.fake.list_objects("events", world.namespace, {})["items"]]


# -- (e) the webhook restarts while objects are created ---------------------------------------


def test_creates_while_the_webhook_restarts_are_refused_then_held_and_queued_once(
    world: World,
) -> None:
    """`failurePolicy: Fail`: a create in a managed namespace while no webhook replica
    answers is refused (500, the API server's words), and nothing is stored: no object runs
    outside Gantry. Retried once it is back, it is held; everything created is queued once."""
    world.fake.webhook = FakeWebhook(user="alice")
    core, batch = client.CoreV1Api(world.api), client.BatchV1Api(world.api)
    batch.create_namespaced_job(world.namespace, job("before", parallelism=1))
    world.fake.webhook.down = True  # its pods restart
    for create, body in (
        (batch.create_namespaced_job, job("during", parallelism=1)),
        (core.create_namespaced_pod, pod("during-pod")),
    ):
        with pytest.raises(ApiException) as refused:
            create(world.namespace, body)
        assert refused.value.status == 500
        status = json.loads(refused.value.body)
        assert (status["reason"], status["code"]) == ("InternalError", 500)
        assert 'failed calling webhook "workloads.gantry.io"' in status["message"]
    assert world.fake.get("jobs", world.namespace, "during") is None
    assert world.pod("during-pod") is None
    world.controller.sync()  # the controller runs on meanwhile
    world.fake.webhook.down = False
    batch.create_namespaced_job(world.namespace, job("during", parallelism=1))  # the user retries
    core.create_namespaced_pod(world.namespace, pod("during-pod"))
    core.create_namespaced_pod(world.namespace, pod("after"))
    for name in ("before", "during"):
        held = world.fake.get("jobs", world.namespace, name)
        assert held["spec"]["suspend"] is True
        assert held["metadata"]["annotations"]["gantry.io/submitted-by"] == "alice"
    for name in ("during-pod", "after"):
        assert [g["name"] for g in world.pod(name)["spec"]["schedulingGates"]] == [GATE]
    world.controller.sync()
    world.controller.sync()
    assert len(gantry_jobs()) == 4 and all(len(v) == 1 for v in gantry_jobs().values())
    assert {j.state for v in gantry_jobs().values() for j in v} == {"queued"}
    world.step()
    assert_admitted_once(world)
    assert_nothing_lost(world)


def test_a_jobset_running_without_a_live_job_is_suspended_by_the_next_reconcile(
    world: World,
) -> None:
    """The sweep knows every kind Gantry resumes: a held JobSet that runs while no live
    Gantry job holds it is suspended by a new daemon's first reconcile."""
    template = {"spec": {"template": {"spec": pod("unused")["spec"]}}}
    body = {
        "apiVersion": "jobset.x-k8s.io/v1alpha2",
        "kind": "JobSet",
        "metadata": {"name": "stray-set", "labels": {"gantry.io/managed": "true"}},
        "spec": {"suspend": False, "replicatedJobs": [{"name": "w", "template": template}]},
    }
    world.fake.create("jobsets", world.namespace, body)
    restart_daemon(world)
    world.clock.advance(1)
    world.daemon.step()
    assert world.fake.get("jobsets", world.namespace, "stray-set")["spec"]["suspend"] is True


def test_a_job_that_fails_podless_while_its_daemon_is_down_fails_while_admitted(
    world: World,
) -> None:
    """The daemon unsuspends a Job and dies before committing (its job admitted, stand-in pod
    names); before another daemon leads, the Job fails with no pod (its controller could not
    make one). The controller fails the job at once with the Job's reason (it used to leave an
    admitted job to a daemon that was not there), and the next daemon releases its GPUs and
    suspends the Job."""
    create_job(world, job("doomed", parallelism=2))
    world.controller.sync()
    world.daemon.hooks = {"before_commit": _raise}
    world.clock.advance(1)
    with pytest.raises(Killed):
        world.daemon.step()
    (mine,) = gantry_jobs()[world.fake.get("jobs", world.namespace, "doomed")["metadata"]["uid"]]
    assert mine.state == "admitted", mine.reason
    failed = world.fake.get("jobs", world.namespace, "doomed")
    message = "Job has reached the specified backoff limit"
    condition = {"type": "Failed", "status": "True", "reason": "BackoffLimitExceeded"}
    failed["status"] = {"failed": 1, "active": 0, "conditions": [{**condition, "message": message}]}
    world.fake.replace("jobs", world.namespace, "doomed", failed)
    world.controller.sync()
    mine.refresh_from_db()
    assert (mine.state, mine.reason) == ("failed", f"its Job failed in Kubernetes: {message}")
    assert ("Failed", True) in [
        (e["reason"], message in e["message"])
        for e in world.fake.list_objects("events", world.namespace, {})["items"]
    ]
    restart_daemon(world)
    world.step()
    world.step()
    assert not Allocation.objects.filter(job=mine, ended_at__isnull=True).exists()
    assert world.fake.get("jobs", world.namespace, "doomed")["spec"]["suspend"] is True
    assert_admitted_once(world)
