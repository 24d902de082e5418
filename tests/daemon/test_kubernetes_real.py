"""Issue 22: the daemon against a real API server (devcluster), cycle by cycle.

The daemon runs in-process on an injected clock, as the other daemon tests do, with the
Kubernetes backend pointed at a real kube-apiserver; `devcluster.kubelets.Kubelets` plays the
nodes and is stepped explicitly. Only the real server is polled, with a deadline.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pytest
from django.db import connection
from kubernetes import client

from devcluster.kubelets import Kubelets, NodeShape
from devcluster.plane import ControlPlane
from scheduler.backends.kubernetes.backend import KubernetesBackend, api_client_from_environment
from scheduler.backends.kubernetes.config import KubernetesConfig
from scheduler.backends.kubernetes.render import LABEL_ATTEMPT, LABEL_JOB
from scheduler.daemon.loop import Daemon
from scheduler.jobs.services import job_submit
from scheduler.leader import Lease
from scheduler.models import Allocation, GpuDevice, Job, JobEvent
from tests.conftest import Org, build_org, job_spec
from tests.daemon.conftest import FakeClock, Killed, expire_leases
from tests.k8s.real_plane import RealPlane, apply_priority_classes, real_plane, require_binaries

pytestmark = pytest.mark.kubernetes
__all__ = ["real_plane"]  # the session fixture, for this module

ROOT = Path(__file__).resolve().parents[2]
DEADLINE_S = 30.0
HEARTBEAT_S = 5.0


def product_client(kubeconfig: Path) -> client.ApiClient:
    """A client made as `run_scheduler --backend kubernetes` makes it, from KUBECONFIG."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("KUBECONFIG", str(kubeconfig))
        return api_client_from_environment()


@dataclass
class Shared:
    """The session's plane (tests/k8s/real_plane.py), with nodes of this module's own whose
    kubelets the tests step themselves, and a client made as the scheduler makes it."""

    plane: RealPlane
    api: client.ApiClient
    kubelets: Kubelets


@pytest.fixture(scope="module")
def shared(real_plane: RealPlane) -> Iterator[Shared]:
    if real_plane.plane is None:
        pytest.skip("these tests play the kubelets: they need the devcluster plane")
    api = product_client(real_plane.kubeconfig)
    played = Kubelets(api)
    played.add_nodes(NODES, NodeShape(gpus=8))
    yield Shared(real_plane, api, played)
    for name in NODES:
        _json(played.core.delete_node, name)
    api.close()


NODES = ("h4-gpu-1", "h4-gpu-2")
# Where a daemon is killed -> the attempt the job then runs under (tests/daemon/test_faults.py).
CRASHES_AT = {"claimed": 1, "pods_created": 0, "bound": 0, "before_commit": 0}


def _json(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> dict[str, Any]:
    """The answer's JSON, read whole before the connection goes back to the pool."""
    response = fn(*args, _preload_content=False, **kwargs)
    try:
        result: dict[str, Any] = json.loads(response.data)
        return result
    finally:
        response.release_conn()


class Real:
    """One test's world: the organisation, a daemon on a fake clock, kubelets on real nodes."""

    def __init__(self, org: Org, api: client.ApiClient, kubelets: Kubelets) -> None:
        self.org, self.api, self.kubelets = org, api, kubelets
        self.core: Any = client.CoreV1Api(api)
        self.clock = FakeClock()
        self.backend = KubernetesBackend(api, KubernetesConfig(request_timeout_s=10.0))
        self.daemon = self.new_daemon("real")
        self.beat_at = -math.inf
        self.heartbeat()

    def new_daemon(self, holder: str, **kwargs: Any) -> Daemon:
        lease = Lease(holder, ttl_s=30)
        return Daemon(self.backend, lease=lease, clock=self.clock, sleep=lambda _s: None, **kwargs)

    def submit(self, user: str = "alice", **overrides: Any) -> Job:
        project = self.org.proj_alpha if user in ("alice", "tina") else self.org.proj_bravo
        spec = job_spec(**{"replicas": 1, "resources": {"gpus": 4}, **overrides})
        job, _ = job_submit(user=self.org.users[user], project=project, payload=spec)
        return job

    def cycle(self, seconds: float = 1.0, cycles: int = 1) -> None:
        for _ in range(cycles):
            self.clock.advance(seconds)
            self.daemon.step()

    def until(
        self, what: str, done: Callable[[], bool], seconds: float = 1.0, kubelets: bool = True
    ) -> None:
        """Step kubelets and daemon until `done()`, polling the real server with a deadline."""
        deadline = time.monotonic() + DEADLINE_S
        while not done():
            if time.monotonic() > deadline:
                raise AssertionError(f"not reached within {DEADLINE_S} s: {what}")
            if kubelets:
                self.kubelets.step()
                self.heartbeat()
            self.cycle(seconds)

    def heartbeat(self) -> None:
        """Renew the nodes' leases every few seconds: the node lifecycle controller marks a
        node silent for 40 s NotReady, and the daemon would fail its jobs over."""
        if time.monotonic() - self.beat_at >= HEARTBEAT_S:
            self.kubelets.heartbeat()
            self.beat_at = time.monotonic()

    @staticmethod
    def state(job: Job) -> str:
        job.refresh_from_db()
        return job.state

    def pods(self, job: Job) -> list[dict[str, Any]]:
        """The job's pods as the server has them (every attempt)."""
        selector = f"{LABEL_JOB}={job.pk}"
        return list(_json(self.core.list_pod_for_all_namespaces, label_selector=selector)["items"])

    def pod(self, job: Job) -> dict[str, Any]:
        (found,) = self.pods(job)
        return found

    def clean(self) -> None:
        """No pod outlives its test (the next one's database does not know it)."""
        for namespace in {p.namespace for p in self.backend.list_pods()}:
            _json(self.core.delete_collection_namespaced_pod, namespace, grace_period_seconds=0)
        self.kubelets.held.clear()
        self.kubelets.endings.clear()


@contextlib.contextmanager
def only_our_nodes(shared: Shared) -> Iterator[None]:
    """The session's own nodes are cordoned while a test runs, so that the daemon places
    only on the nodes whose kubelets the test steps."""
    core: Any = client.CoreV1Api(shared.api)
    for name in shared.plane.nodes:
        _json(core.patch_node, name, {"spec": {"unschedulable": True}})
    try:
        yield
    finally:
        for name in shared.plane.nodes:
            _json(core.patch_node, name, {"spec": {"unschedulable": False}})


@pytest.fixture
def real(db: Any, shared: Shared) -> Iterator[Real]:
    world = Real(build_org(), shared.api, shared.kubelets)
    with only_our_nodes(shared):
        yield world
        world.clean()


@pytest.mark.parametrize("create_bound", [True, False], ids=["created-bound", "create-then-bind"])
def test_a_job_runs_to_succeeded_through_create_bind_run(real: Real, create_bound: bool) -> None:
    """Created on its node in one call (the default), or created unbound and then bound
    through the Binding API (GANTRY_K8S_CREATE_BOUND=false): either way it runs."""
    real.backend.config = replace(real.backend.config, create_bound=create_bound)
    job = real.submit()
    created: list[dict[str, Any]] = []
    real.daemon.hooks["pods_created"] = lambda: created.extend(real.pods(job))
    real.cycle()
    ((first,),) = [created]  # as the server had it once its pods were all created
    assert first["spec"]["schedulerName"] == "gantry"
    if create_bound:
        assert first["spec"].get("nodeName") in NODES
    else:
        assert not first["spec"].get("nodeName")
    pod = real.pod(job)
    assert pod["spec"].get("nodeName") in NODES
    assert real.state(job) == "binding"
    real.until("pod running", lambda: real.state(job) == "running")
    assert real.pod(job)["status"]["phase"] == "Running"
    real.kubelets.succeed(pod["metadata"]["namespace"], pod["metadata"]["name"])
    real.until("job succeeded", lambda: real.state(job) == "succeeded")
    assert Allocation.objects.get(job=job).ended_at is not None
    assert not GpuDevice.objects.filter(allocated_milli__gt=0).exists()


def test_a_failed_pod_fails_its_attempt_and_is_retried_per_policy(real: Real) -> None:
    job = real.submit(retry={"limit": 1, "backoff_s": 0})
    real.until("running", lambda: real.state(job) == "running")
    first = real.pod(job)["metadata"]
    real.kubelets.fail(first["namespace"], first["name"], exit_code=3)
    real.until("retried", lambda: Job.objects.get(pk=job.pk).attempt == 1)
    failed = JobEvent.objects.get(job=job, kind="attempt_failed")
    assert "exit code 3" in failed.message
    real.until("retry running", lambda: real.state(job) == "running")
    second = next(p for p in real.pods(job) if p["metadata"]["name"] != first["name"])
    assert second["metadata"]["labels"][LABEL_ATTEMPT] == "1"
    real.kubelets.fail(second["metadata"]["namespace"], second["metadata"]["name"])
    real.until("failed", lambda: real.state(job) == "failed")
    real.until("released", lambda: not Allocation.objects.filter(ended_at__isnull=True).exists())
    assert not GpuDevice.objects.filter(allocated_milli__gt=0).exists()


def test_preemption_deletes_with_grace_and_waits_for_the_kubelet(real: Real) -> None:
    low = [
        real.submit(resources={"gpus": 8}, priority_class="low", simulation={"duration_s": 1})
        for _ in NODES
    ]
    real.daemon.profile = type(real.daemon.profile)(min_runtime_s=0)
    real.until("low running", lambda: all(real.state(j) == "running" for j in low))
    urgent = real.submit(resources={"gpus": 8}, priority_class="critical")
    real.cycle()
    (victim,) = [j for j in low if real.state(j) == "preempted"]
    pod = real.pod(victim)
    # Deleted with grace: Terminating on the server until the kubelet confirms.
    assert pod["metadata"]["deletionTimestamp"]
    assert pod["metadata"]["deletionGracePeriodSeconds"] == 30
    real.cycle(seconds=5, cycles=3)  # the kubelet says nothing yet
    assert real.pod(victim)["metadata"]["deletionTimestamp"]
    assert Allocation.objects.get(job=victim).ended_at is None  # its devices stay held
    assert real.state(urgent) == "queued"
    real.until("requeued", lambda: Job.objects.get(pk=victim.pk).attempt == 1)
    assert real.state(victim) == "queued"
    assert Allocation.objects.get(job=victim, attempt=0).ended_at is not None
    real.until("urgent running", lambda: real.state(urgent) == "running")
    names = [p["metadata"]["name"] for p in real.pods(victim)]
    assert names == []  # the victim's old pod is gone and it waits for room


def test_a_pod_deleted_out_of_band_fails_over(real: Real) -> None:
    job = real.submit(retry={"limit": 0})
    real.until("running", lambda: real.state(job) == "running")
    meta = real.pod(job)["metadata"]
    _json(real.core.delete_namespaced_pod, meta["name"], meta["namespace"], grace_period_seconds=0)
    real.cycle()
    job.refresh_from_db()
    assert (job.state, job.attempt) == ("binding", 1)  # node loss: requeued and placed at once
    assert "vanished" in JobEvent.objects.get(job=job, kind="attempt_failed").message


def test_a_pod_held_pending_fails_at_the_binding_deadline_with_its_cause(real: Real) -> None:
    timeout = 600.0
    real.daemon = real.new_daemon("stuck", binding_timeout_s=timeout)
    job = real.submit(retry={"limit": 0})
    real.cycle()
    meta = real.pod(job)["metadata"]
    real.kubelets.hold_pending(meta["namespace"], meta["name"])
    real.kubelets.step()
    (status,) = [p for p in real.backend.list_pods() if p.job_id == job.pk]
    assert "ImagePullBackOff" in status.waiting
    real.cycle(seconds=timeout - 10)
    assert real.state(job) == "binding"
    real.cycle(seconds=20)
    job.refresh_from_db()
    assert job.state == "failed"
    assert "did not start" in job.reason and "ImagePullBackOff" in job.reason
    real.until("released", lambda: not Allocation.objects.filter(ended_at__isnull=True).exists())


def _killed() -> None:
    raise Killed


@pytest.mark.parametrize(("step", "attempt"), list(CRASHES_AT.items()))
def test_a_daemon_killed_at_each_step_loses_nothing_on_a_real_server(
    real: Real, step: str, attempt: int
) -> None:
    """The next leader adopts what the real server holds (a pod created, with the defaults
    admission added; or bound) or releases the claim, and the job runs once."""
    job = real.submit()
    first = real.new_daemon("first", hooks={step: _killed})
    with pytest.raises(Killed):
        first.step()
    expire_leases()
    real.daemon = real.new_daemon("second")
    real.until("running", lambda: real.state(job) == "running")
    job.refresh_from_db()
    assert job.attempt == attempt
    assert [p["metadata"]["name"] for p in real.pods(job)] == [f"gantry-{job.pk}-a{attempt}-r0"]
    assert Allocation.objects.filter(ended_at__isnull=True).count() == 1


def test_a_two_replica_job_and_a_gpu_share_are_admitted_and_run(real: Real) -> None:
    """What only a real server checks: the replicas' headless Service (owned by replica 0),
    and a share's sharing-layer resources, pass validation and restricted Pod Security."""
    gang = real.submit(replicas=2, resources={"gpus": 6})
    share = real.submit(resources={"gpu_milli": 500, "gpu_memory_mib": 20000}, replicas=1)
    real.until("both running", lambda: {real.state(gang), real.state(share)} == {"running"})
    pods = real.pods(gang)
    assert len(pods) == 2 and len({p["spec"]["nodeName"] for p in pods}) == 2
    namespace = pods[0]["metadata"]["namespace"]
    services = _json(real.core.list_namespaced_service, namespace)["items"]
    (service,) = [s for s in services if s["metadata"]["labels"].get(LABEL_JOB) == str(gang.pk)]
    (owner,) = service["metadata"]["ownerReferences"]
    assert owner["name"] == f"gantry-{gang.pk}-a0-r0"
    for job in (gang, share):
        for pod in real.pods(job):
            real.kubelets.succeed(pod["metadata"]["namespace"], pod["metadata"]["name"])
    real.until("succeeded", lambda: {real.state(gang), real.state(share)} == {"succeeded"})


def test_a_job_on_a_lost_node_fails_over_and_its_terminating_pod_is_force_deleted(
    real: Real,
) -> None:
    grace = 300.0
    real.daemon = real.new_daemon("lost", node_lost_grace_s=grace)
    job = real.submit(retry={"limit": 0})
    real.until("running", lambda: real.state(job) == "running")
    old = real.pod(job)
    node = old["spec"]["nodeName"]
    real.kubelets.lose_node(node)
    try:
        real.cycle()  # NotReady: the attempt fails (node lost) and is retried elsewhere
        job.refresh_from_db()
        assert job.attempt == 1
        real.cycle(seconds=grace / 2)
        (stuck,) = [p for p in real.pods(job) if p["metadata"]["name"] == old["metadata"]["name"]]
        assert stuck["metadata"]["deletionTimestamp"]  # Terminating: no kubelet confirms
        assert Allocation.objects.get(job=job, attempt=0).ended_at is None
        real.cycle(seconds=grace)  # past the grace: force-deleted, its devices released
        assert old["metadata"]["name"] not in [p["metadata"]["name"] for p in real.pods(job)]
        assert Allocation.objects.get(job=job, attempt=0).ended_at is not None
        assert not GpuDevice.objects.filter(node__name=node, allocated_milli__gt=0).exists()
        real.until("retry running", lambda: real.state(job) == "running")
        assert real.pod(job)["spec"]["nodeName"] != node
    finally:
        real.kubelets.lost.discard(node)  # the node comes back for the next tests
        real.kubelets.add_nodes([node], NodeShape(gpus=8))


def test_a_pod_the_server_refuses_says_why_in_the_jobs_reason(real: Real) -> None:
    """A ResourceQuota of no pods in the project's namespace (which only a real server
    enforces): the bind fails with the server's own explanation, not "403: Forbidden"."""
    namespace = real.org.proj_alpha.namespace
    real.backend.ensure_namespace(namespace)
    quota = {"metadata": {"name": "no-pods"}, "spec": {"hard": {"pods": "0"}}}
    _json(real.core.create_namespaced_resource_quota, namespace, quota)
    try:
        job = real.submit()
        real.cycle()
        job.refresh_from_db()
        assert job.state == "queued"
        assert "forbidden" in job.reason and "quota" in job.reason, job.reason
    finally:
        _json(real.core.delete_namespaced_resource_quota, "no-pods", namespace)


# -- watches: a plane of their own, since they compact its store and restart its server ----


@pytest.fixture
def own_plane(tmp_path: Path) -> Iterator[tuple[ControlPlane, client.ApiClient]]:
    """A plane for one test (skipping or failing, saying why, where none can start)."""
    require_binaries()
    started = ControlPlane(tmp_path / "plane").start(controller_manager=True)
    api = product_client(started.kubeconfig)
    try:
        apply_priority_classes(api)
        yield started, api
    finally:
        api.close()
        started.stop()
        shutil.rmtree(tmp_path / "plane" / "etcd", ignore_errors=True)


def _set_within(event: threading.Event, what: str) -> None:
    if not event.wait(DEADLINE_S):
        raise AssertionError(f"no wake-up within {DEADLINE_S} s: {what}")


def test_jobs_run_through_a_compaction_and_an_apiserver_restart(
    db: Any, own_plane: tuple[ControlPlane, client.ApiClient]
) -> None:
    plane, api = own_plane
    kubelets = Kubelets(api)
    kubelets.add_nodes(["watch-gpu-1"], NodeShape(gpus=8))
    real = Real(build_org(), api, kubelets)
    stop = threading.Event()
    woken = real.backend.watch_pods(stop, timeout_s=60)
    try:
        first = [real.submit() for _ in range(2)]
        real.until("running", lambda: all(real.state(j) == "running" for j in first))
        watcher, _nodes = real.backend._watchers  # the pod watch, then the node watch
        relists = watcher.relists
        # A watcher of its own, left at the version before the compaction.
        stale = real.backend.pod_watcher(lambda _pods: None, lambda *_: None, timeout_s=5)
        stale.run_once()
        old = stale.resource_version
        # A compaction: the open watch goes on (or lists again) and still wakes the daemon.
        plane.compact()
        woken.clear()
        meta = real.pod(first[0])["metadata"]
        kubelets.succeed(meta["namespace"], meta["name"])
        kubelets.step()
        _set_within(woken, "a pod ended after the compaction")
        real.until("first succeeded", lambda: real.state(first[0]) == "succeeded")
        # A restart while the daemon runs: cycles fail while the server is away, and the
        # watch lists again once it is back.
        plane.stop_process("kube-apiserver")
        late = real.submit()
        real.cycle()  # the server is away: the cycle fails, nothing is written
        assert real.state(late) == "queued"
        plane.restart_apiserver()
        woken.clear()
        real.until("late running", lambda: real.state(late) == "running")
        _set_within(woken, "pods changed after the restart")
        assert watcher.relists > relists
        # The restarted server's watch cache starts after the compaction: a watch from the
        # old version answers 410 Expired (an ERROR event in a 200 stream), and the watcher
        # lists again at once, without counting it a failure.
        stale.run_once()
        assert stale.resource_version is None and stale._failures == 0
        stale.run_once()
        assert stale.relists == 2 and stale.resource_version not in (None, old)
        for job in (first[1], late):
            meta = real.pod(job)["metadata"]
            kubelets.succeed(meta["namespace"], meta["name"])
        real.until(
            "all succeeded", lambda: all(real.state(j) == "succeeded" for j in [*first, late])
        )
    finally:
        stop.set()
        real.backend.close_watches()
    # No job lost or doubled: one attempt, one allocation, one pod each.
    for job in [*first, late]:
        job.refresh_from_db()
        assert job.attempt == 0
        assert Allocation.objects.filter(job=job).count() == 1
    assert not Allocation.objects.filter(ended_at__isnull=True).exists()


# -- the command itself -------------------------------------------------------------------


def _database_url() -> str:
    """The test database, for a second process (committed rows only: transactional_db)."""
    db = connection.settings_dict
    if db["ENGINE"].endswith("sqlite3"):
        return f"sqlite:///{db['NAME']}"
    password = f":{db['PASSWORD']}" if db.get("PASSWORD") else ""
    return f"postgres://{db['USER']}{password}@{db['HOST']}:{db['PORT'] or 5432}/{db['NAME']}"


def test_run_scheduler_on_the_kubernetes_backend_runs_jobs_and_stops_on_sigterm(
    transactional_db: Any, shared: Shared, tmp_path: Path
) -> None:
    kubelets = shared.kubelets
    world = Real(build_org(), shared.api, kubelets)
    jobs = [world.submit() for _ in range(2)]
    env = {
        **os.environ,
        "DATABASE_URL": _database_url(),
        "KUBECONFIG": str(shared.plane.kubeconfig),
        "GANTRY_VAR_DIR": str(tmp_path),
    }
    log_path = tmp_path / "scheduler.log"
    command = [sys.executable, "manage.py", "run_scheduler", "--backend", "kubernetes"]
    with only_our_nodes(shared), log_path.open("w") as log:
        process = subprocess.Popen(
            [*command, "--interval", "0.5"], cwd=ROOT, env=env, stdout=log, stderr=log
        )
        try:
            deadline = time.monotonic() + 2 * DEADLINE_S
            while not all(world.state(j) == "succeeded" for j in jobs):
                assert process.poll() is None, log_path.read_text()[-3000:]
                assert time.monotonic() < deadline, log_path.read_text()[-3000:]
                kubelets.step()
                world.heartbeat()
                for job in jobs:
                    if world.state(job) == "running":
                        meta = world.pod(job)["metadata"]
                        kubelets.succeed(meta["namespace"], meta["name"])
                time.sleep(0.2)  # polls the real server (and the process) with a deadline
            process.send_signal(signal.SIGTERM)
            assert process.wait(timeout=DEADLINE_S) == 0
        finally:
            if process.poll() is None:
                process.kill()
                process.wait()
            world.clean()
    output = log_path.read_text()
    assert "on the kubernetes backend" in output
    assert "finishing the current cycle" in output
    assert all(Allocation.objects.get(job=j).ended_at is not None for j in jobs)
