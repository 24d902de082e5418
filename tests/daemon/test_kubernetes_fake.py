"""The daemon over the Kubernetes backend and the fake API server, on a fake clock: the fast
suite's mirror of tests/daemon/test_kubernetes_real.py for what the real server taught us
(issue 22). The fake plays the kubelet when told (`run_container`, `set_pod_status`)."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import pytest

from scheduler.backends.kubernetes.backend import KubernetesBackend
from scheduler.backends.kubernetes.config import KubernetesConfig
from scheduler.backends.retry import RetryPolicy
from scheduler.daemon.loop import Daemon
from scheduler.jobs.services import job_submit
from scheduler.leader import Lease, LeaseLost
from scheduler.models import Allocation, Job, JobEvent
from tests.conftest import Org, build_org, job_spec
from tests.daemon.conftest import FakeClock
from tests.k8s.builders import make_request
from tests.k8s.conftest import api_client_for, started_fake
from tests.k8s.fake_apiserver import FakeApiServer


class World:
    def __init__(self, org: Org, fake: FakeApiServer) -> None:
        self.org, self.fake = org, fake
        self.clock = FakeClock()
        self.api = api_client_for(fake.url)
        policy = RetryPolicy(attempts=3, base_s=0.0, cap_s=0.0)
        self.backend = KubernetesBackend(
            self.api, KubernetesConfig(request_timeout_s=5.0), policy=policy, sleep=lambda _s: None
        )
        lease = Lease("fake-k8s", ttl_s=30)
        self.daemon = Daemon(self.backend, lease=lease, clock=self.clock, sleep=lambda _s: None)

    def submit(self, **overrides: Any) -> Job:
        spec = job_spec(**{"replicas": 1, "resources": {"gpus": 4}, **overrides})
        job, _ = job_submit(user=self.org.users["alice"], project=self.org.proj_alpha, payload=spec)
        return job

    def cycle(self, seconds: float = 1.0) -> None:
        self.clock.advance(seconds)
        self.daemon.step()

    def pod_name(self, job: Job) -> str:
        job.refresh_from_db()
        return f"gantry-{job.pk}-a{job.attempt}-r0"


@pytest.fixture
def world(db: Any) -> Iterator[World]:
    fake = started_fake("k8s-gpu-1")
    made = World(build_org(), fake)
    yield made
    made.api.close()
    fake.stop()


def test_a_job_runs_to_succeeded_over_the_fake_apiserver(world: World) -> None:
    job = world.submit()
    world.cycle()
    job.refresh_from_db()
    assert job.state == "binding"
    namespace, name = world.org.proj_alpha.namespace, world.pod_name(job)
    assert world.fake.get("pods", namespace, name)["spec"]["nodeName"] == "k8s-gpu-1"
    world.fake.run_container(namespace, name)
    world.cycle()
    job.refresh_from_db()
    assert job.state == "running"
    world.fake.set_pod_status(namespace, name, {"phase": "Succeeded"})
    world.cycle()
    job.refresh_from_db()
    assert job.state == "succeeded"
    world.cycle()
    assert Allocation.objects.get(job=job).ended_at is not None
    assert world.fake.get("pods", namespace, name) is None  # finished: deleted at once


def test_the_first_job_of_a_new_namespace_binds_though_its_service_account_lags(
    world: World,
) -> None:
    """The project's namespace does not exist: the backend creates it, and the pod is refused
    until the namespace's service account exists (a real server's race): retried, bound in
    the same cycle, no bind failure counted (tests/k8s/test_refusals.py pins the backend's
    own retry of it)."""
    world.fake.account_lag = True
    job = world.submit()
    world.cycle()
    job.refresh_from_db()
    assert (job.state, job.attempt) == ("binding", 0), job.reason
    assert not job.events.filter(kind="bind_failed").exists()


def test_a_pod_the_server_refuses_says_why_in_the_jobs_reason(world: World) -> None:
    world.fake.inject("403", r"/api/v1/namespaces/[^/]+/pods\Z", method="POST", count=10)
    job = world.submit()
    world.cycle()
    job.refresh_from_db()
    assert job.state == "queued"
    assert "apiserver 403: Forbidden: injected" in job.reason


def test_a_failing_pod_create_costs_the_backends_tries_and_no_more(world: World) -> None:
    """One retry layer, the backend's: the daemon fences and calls once, so a create the
    server keeps failing is sent `RetryPolicy.attempts` times in the cycle (it was four of
    the daemon's tries around three of the client's: twelve)."""
    world.fake.inject("503", r"/api/v1/namespaces/[^/]+/pods\Z", method="POST", count=100)
    job = world.submit()
    world.cycle()
    job.refresh_from_db()
    assert job.state == "queued" and "creating pods failed" in job.reason
    posts = [p for m, p in world.fake.requests if m == "POST" and p.endswith("/pods")]
    assert len(posts) == world.backend.policy.attempts == 3


def test_every_try_of_a_write_is_fenced_inside_the_backends_retries(world: World) -> None:
    """The backend fences each try of a write with the daemon's lease fence: once the
    lease is gone, its next retry sends nothing."""
    world.backend.create_pod(make_request(1))  # the namespace exists from here on
    world.fake.inject("503", r"/api/v1/namespaces/[^/]+/pods\Z", method="POST", count=100)
    before = [p for m, p in world.fake.requests if m == "POST" and p.endswith("/pods")]
    checks: list[int] = []

    def fence() -> None:
        checks.append(1)
        if len(checks) > 1:
            raise LeaseLost("lease lost before a write to the cluster")

    with world.backend.fenced(fence), pytest.raises(LeaseLost):
        world.backend.create_pod(make_request(2))
    posts = [p for m, p in world.fake.requests if m == "POST" and p.endswith("/pods")]
    assert len(posts) - len(before) == 1 and len(checks) == 2


def test_with_its_watch_running_the_daemon_reconciles_from_the_cache(world: World) -> None:
    """Issue 37: the daemon's watch fills the informer; reconcile reads the pods from it, and
    each cycle sees the pods the one before created (read-your-writes), so nothing is judged
    vanished. The kubelet's changes arrive as events: the job runs, then succeeds."""
    stop = threading.Event()
    changed = world.backend.watch_pods(stop, timeout_s=30)
    try:
        assert changed.wait(5.0)
        jobs = [world.submit(resources={"gpus": 2}) for _ in range(3)]
        world.cycle()
        world.cycle()  # reconcile reads the three pods it just created, from the cache
        names = [(world.org.proj_alpha.namespace, world.pod_name(j)) for j in jobs]
        for job in jobs:
            job.refresh_from_db()
        assert [j.state for j in jobs[:2]] == ["binding", "binding"], [j.reason for j in jobs]
        for namespace, name in names[:2]:
            world.fake.run_container(namespace, name)
        until(world, lambda: all(state(j) == "running" for j in jobs[:2]))
        world.fake.set_pod_status(*names[0], {"phase": "Succeeded"})
        until(world, lambda: state(jobs[0]) == "succeeded")
        informer = world.backend.informer
        assert informer is not None and informer.reads >= 3 and informer.fallbacks == 0
        assert not JobEvent.objects.filter(kind="attempt_failed").exists()
    finally:
        stop.set()
        world.backend.close_watches()


def state(job: Job) -> str:
    return Job.objects.values_list("state", flat=True).get(pk=job.pk)


def until(world: World, done: Any, cycles: int = 50) -> None:
    """Cycles until `done()`: the watch's events come on their own thread, a moment later."""
    for _ in range(cycles):
        if done():
            return
        threading.Event().wait(0.05)
        world.cycle()
    raise AssertionError("not reached")
