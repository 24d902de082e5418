"""The daemon on PostgreSQL with the simulated cluster, on a fake clock.

`env` gives the organisation of tests/conftest.py, a simulated cluster of H100 nodes synced
into the database, and `env.daemon()` makes a daemon (its own lease holder) on the same
database and backend, so a "restart" is simply a new instance.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import pytest
from django.db.models import DateTimeField, ExpressionWrapper
from django.db.models.functions import Now
from rest_framework.test import APIClient

from scheduler.backends.simulated.cluster import SimulatedCluster
from scheduler.backends.simulated.inventory import make_nodes
from scheduler.daemon.loop import Daemon
from scheduler.jobs.services import job_submit
from scheduler.leader import Lease
from scheduler.models import Allocation, AllocationDevice, GpuDevice, Job, SchedulerLease
from tests.conftest import Org, build_org, job_spec


class FakeClock:
    def __init__(self, start: float = 1_900_000_000.0) -> None:
        self.t = start

    def __call__(self) -> float:
        return self.t

    def advance(self, seconds: float) -> None:
        self.t += seconds


class Killed(Exception):
    """Stands for SIGKILL at a step of the cycle."""


@dataclass
class Env:
    org: Org
    clock: FakeClock
    backend: SimulatedCluster
    daemons: list[Daemon] = field(default_factory=list)

    def daemon(self, holder: str = "", hooks: dict[str, Callable[[], None]] | None = None,
               **kwargs: Any) -> Daemon:  # fmt: skip
        lease = Lease(holder or f"daemon-{len(self.daemons)}", ttl_s=30)
        made = Daemon(self.backend, lease=lease, clock=self.clock, sleep=lambda _s: None,
                      hooks=hooks, **kwargs)  # fmt: skip
        self.daemons.append(made)
        return made

    def submit(self, user: str = "alice", **overrides: Any) -> Job:
        project = self.org.proj_alpha if user in ("alice", "tina") else self.org.proj_bravo
        spec = job_spec(**{"replicas": 1, "resources": {"gpus": 4}, **overrides})
        job, _ = job_submit(user=self.org.users[user], project=project, payload=spec)
        return job

    def run(self, daemon: Daemon, seconds: float = 0.0, cycles: int = 1) -> None:
        """`cycles` steps, the clock moving `seconds` before each."""
        for _ in range(cycles):
            self.clock.advance(seconds)
            daemon.step()


def low_priority_cluster(env: Env) -> tuple[list[Job], Daemon]:
    """The cluster filled with low-priority jobs (4 x 8 GPUs), placed and bound, and the daemon
    that runs them, allowed to preempt at once (no minimum runtime)."""
    low = [
        env.submit(resources={"gpus": 8}, priority_class="low", simulation={"duration_s": 10_000})
        for _ in range(4)
    ]
    daemon = env.daemon()
    daemon.profile = type(daemon.profile)(min_runtime_s=0)
    env.run(daemon, seconds=2, cycles=2)
    return low, daemon


def expire_leases() -> None:
    """Stands for the lease TTL passing after a leader's death (no waiting)."""
    SchedulerLease.objects.update(
        expires_at=ExpressionWrapper(Now() - timedelta(seconds=1), output_field=DateTimeField())
    )


def assert_consistent(backend: SimulatedCluster) -> None:
    """The promises: no device allocated beyond 1000 milli, the trigger-kept counters agree
    with the live shares, every live pod has an active allocation, and every bound active
    allocation of a running job has its pod."""
    live_shares: dict[int, int] = {}
    for device_id, milli in AllocationDevice.objects.filter(released=False).values_list(
        "device_id", "milli"
    ):
        live_shares[device_id] = live_shares.get(device_id, 0) + milli
    for device in GpuDevice.objects.all():
        assert 0 <= device.allocated_milli <= 1000, device
        assert device.allocated_milli == live_shares.get(device.pk, 0), device
    active = set(
        Allocation.objects.filter(ended_at__isnull=True).values_list("pod_name", flat=True)
    )
    pods = {p.name for p in backend.list_pods() if not p.deleting}
    assert pods <= active, f"pods without allocation: {pods - active}"
    running = Allocation.objects.filter(
        ended_at__isnull=True, end_reason="", job__state__in=["binding", "running"]
    ).values_list("pod_name", flat=True)
    assert set(running) <= pods, f"allocations without pods: {set(running) - pods}"


def make_env(nodes: int = 4) -> Env:
    org = build_org()
    clock = FakeClock()
    # Backoff between the cluster's own retries passes no time: tests never sleep.
    backend = SimulatedCluster(make_nodes(nodes, "H100-80GB", 8, prefix="h100"), clock=clock,
                               start_delay_s=1.0, grace_cap_s=2.0,
                               retry_sleep=lambda _s: None)  # fmt: skip
    return Env(org, clock, backend)


# A test that runs a daemon's loop (`run()`) ends it by setting `stop`; a loop whose cycles
# all fail never reaches the test's own stop, and would hang the suite: this ends it.
LOOP_WATCHDOG_S = 60.0


def watched(env: Env) -> Iterator[Env]:
    """`env`, with every loop of its daemons stopped after LOOP_WATCHDOG_S."""
    timer = threading.Timer(LOOP_WATCHDOG_S, lambda: [d.stop.set() for d in env.daemons])
    timer.daemon = True
    timer.start()
    try:
        yield env
    finally:
        timer.cancel()


@pytest.fixture
def env(db: Any) -> Iterator[Env]:
    yield from watched(make_env())


@pytest.fixture
def clients(env: Env) -> Callable[[str], APIClient]:
    """clients("pat") -> an APIClient authenticated as that persona of `env.org`."""

    def make(username: str) -> APIClient:
        client = APIClient()
        client.force_authenticate(env.org.users[username])
        return client

    return make


@pytest.fixture
def tenv(transactional_db: Any) -> Iterator[Env]:
    yield from watched(make_env())


__all__ = [
    "Env",
    "FakeClock",
    "Killed",
    "SchedulerLease",
    "assert_consistent",
    "expire_leases",
]
