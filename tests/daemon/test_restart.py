"""A scheduler restart or failover on the simulated cluster leaves running jobs running, as
on a real cluster (issue 17, point 10: the simulated cluster lived in the daemon's process,
so every restart made every pod vanish and their jobs failed with "node lost")."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from scheduler.backends.simulated.inventory import make_nodes
from scheduler.backends.simulated.statefile import PersistentCluster
from scheduler.models import Job, JobEvent, SchedulerLease
from tests.conftest import build_org
from tests.daemon.conftest import Env, FakeClock, assert_consistent, expire_leases


def cluster(path: Path, clock: FakeClock) -> PersistentCluster:
    nodes = make_nodes(4, "H100-80GB", 8, prefix="h100")
    return PersistentCluster(nodes, path, clock=clock, start_delay_s=1.0, grace_cap_s=2.0)


def test_running_jobs_survive_a_restart_and_a_failover(db: Any, tmp_path: Path) -> None:
    clock = FakeClock()
    state = tmp_path / "simulated-cluster.state"
    env = Env(build_org(), clock, cluster(state, clock))
    jobs = [env.submit(simulation={"duration_s": 10_000}) for _ in range(3)]
    env.run(env.daemon("first"), seconds=2, cycles=2)
    assert set(Job.objects.values_list("state", flat=True)) == {"running"}

    # 1. a restart: the process (daemon and its cluster object) is gone; a new one starts
    env.backend = cluster(state, clock)
    expire_leases()
    restarted = env.daemon("restarted")
    env.run(restarted, seconds=2, cycles=3)
    # 2. a failover: a standby in another process takes over from a leader that froze
    leader_backend, env.backend = env.backend, cluster(state, clock)
    standby = env.daemon("standby")
    expire_leases()
    env.run(standby, seconds=2, cycles=3)
    assert standby.lease.leading

    for job in jobs:
        job.refresh_from_db()
        assert (job.state, job.attempt) == ("running", 0), job.reason
    assert not JobEvent.objects.filter(message__icontains="lost").exists()
    assert len(leader_backend.list_pods()) == 3  # both processes see the same pods
    assert_consistent(env.backend)


def test_the_daemon_and_a_restarted_one_keep_scheduling_after_a_reclaim(env: Env) -> None:
    """Issue 17, point 1: on the embedded default (SQLite) the daemon stopped for good after
    the first preemption. The next cycle read the victim's `preempted` event through a raw
    cursor, which gives SQLite's naive time, compared it with an aware one (TypeError),
    dropped the lease, and a restarted daemon failed the same way while the event stayed in
    the look-back window. This runs on both databases."""
    # alpha borrows the whole cluster (4 x 8 H100), then bravo claims its guarantee back
    for _ in range(4):
        env.submit(resources={"gpus": 8}, simulation={"duration_s": 10_000})
    daemon = env.daemon()
    daemon.profile = type(daemon.profile)(min_runtime_s=0)
    env.run(daemon, seconds=2, cycles=2)
    assert Job.objects.filter(state="running").count() == 4
    vision = env.submit(user="bob-bravo", resources={"gpus": 8}, simulation={"duration_s": 60})
    env.run(daemon, seconds=1, cycles=4)  # the reclaim, then cycles that read its event
    assert (
        Job.objects.filter(state="preempted").count()
        + Job.objects.filter(state="queued", attempt=1).count()
        == 1
    )
    vision.refresh_from_db()
    assert vision.state in ("binding", "running")
    assert daemon.lease.leading and SchedulerLease.objects.get().cycle_failures == 0
    # a restart while the preemption is still in the look-back window
    restarted = env.daemon("restarted")
    daemon.lease.release()
    late = env.submit(user="bob-bravo", resources={"gpus": 1}, simulation={"duration_s": 60})
    env.run(restarted, seconds=1, cycles=2)
    assert restarted.lease.leading and SchedulerLease.objects.get().cycle_failures == 0
    late.refresh_from_db()
    assert late.state != "queued" or late.reason  # decided on: placed, or told why it waits
    assert_consistent(env.backend)
