"""The lease (`scheduler.daemon.lease`, `scheduler.leader`): renewed a few times per TTL; a
leader's writes fenced by it; kept through the whole cycle (every phase that writes renews
it first once a third of the TTL has passed, the phases after the binds included).

Issue 17, point 4: a leader that stalls inside a call to the cluster while its lease
expires and another daemon takes over must not write to the cluster afterwards: no delete,
no bind. The stall is a fake backend call that, while "blocked", lets the clock pass, the
lease expire and the new leader run a cycle (`SimulatedCluster.stall`).

Issue 17, point 10: a leader frozen inside a write transaction (SIGSTOP) holds the lease
row's lock. Bounded two ways: the daemon's PostgreSQL sessions carry server-side timeouts
(the server ends a session idle in a transaction), and a takeover never waits on the row."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from django.db import connection

import scheduler.daemon.loop as loop
from scheduler.daemon.loop import Daemon
from scheduler.leader import LeaseLost, configure_session, session_settings
from scheduler.models import SchedulerLease
from tests.daemon.conftest import Env, assert_consistent, expire_leases
from tests.daemon.test_faults import pg


def stall_once(env: Env, method: str, meanwhile: Callable[[], None]) -> list[str]:
    """The next call of `method` stalls while `meanwhile` runs (the simulated cluster's
    `stall`), then completes as the cluster would have done it. Returns the log of the
    backend's write calls."""
    env.backend.stall(method, meanwhile)
    writes: list[str] = []
    for name in ("create_pod", "bind_pod", "delete_pod"):
        inner = getattr(env.backend, name)

        def logged(*args: Any, _inner: Any = inner, _name: str = name) -> Any:
            writes.append(f"{_name} {args[1] if _name != 'create_pod' else args[0].name}")
            return _inner(*args)

        setattr(env.backend, name, logged)
    return writes


def takeover(env: Env, new: Daemon) -> Callable[[], None]:
    def run() -> None:
        env.clock.advance(60)  # the stall outlasts the lease (30 s in these tests)
        expire_leases()
        env.run(new)

    return run


def test_a_stale_leader_stalled_listing_pods_deletes_none_of_the_new_leaders(env: Env) -> None:
    stale, new = env.daemon("stale"), env.daemon("new")
    env.run(stale)
    job = env.submit(simulation={"duration_s": 600})  # placed by the new leader, not the stale
    writes = stall_once(env, "list_pods", takeover(env, new))
    assert stale.step() is False  # reconcile: its listing came back after the takeover
    assert not stale.lease.leading
    job.refresh_from_db()
    assert job.state == "binding"  # the new leader's pod: an "orphan" to the stale one
    (pod,) = env.backend.list_pods()
    assert pod.job_id == job.pk and not pod.deleting
    assert [w for w in writes if w.startswith("delete_pod")] == []
    assert_consistent(env.backend)


def test_a_stale_leader_stalled_creating_a_pod_does_not_bind_it(env: Env) -> None:
    stale, new = env.daemon("stale"), env.daemon("new")
    env.run(stale)
    job = env.submit(simulation={"duration_s": 600})
    writes = stall_once(env, "create_pod", takeover(env, new))
    assert stale.step() is False  # claimed, then its create stalled past the lease
    stale_pod = f"gantry-{job.pk}-a0-r0"
    assert f"bind_pod {stale_pod}" not in writes
    pods = {p.name: p for p in env.backend.list_pods()}
    assert pods[stale_pod].node is None  # created by the stalled call, never bound
    job.refresh_from_db()
    assert (job.state, job.attempt) == ("binding", 1)  # the new leader's own attempt
    assert pods[f"gantry-{job.pk}-a1-r0"].node is not None
    env.run(new, seconds=3)  # the stale leader's pod is an orphan to the new leader
    assert stale_pod not in {p.name for p in env.backend.list_pods()}
    assert_consistent(env.backend)


def test_a_write_to_the_cluster_is_not_sent_once_the_lease_has_passed(env: Env) -> None:
    """Every write goes through `Cluster.call`, which re-checks the lease once the
    daemon's clock has moved on."""
    stale = env.daemon("stale")
    env.run(stale)
    env.clock.advance(60)
    expire_leases()
    assert env.daemon("new").lease.acquire()
    sent: list[str] = []
    with pytest.raises(LeaseLost):
        stale.cluster.call(lambda: sent.append("delete"))
    assert sent == []


def test_lease_is_renewed_a_few_times_per_ttl_not_every_cycle(env: Env) -> None:
    from scheduler.models import SchedulerLease

    daemon = env.daemon()  # TTL 30 s: renewed every 5 s of the daemon's clock
    env.run(daemon)
    renewed = SchedulerLease.objects.get().renewed_at
    env.run(daemon, seconds=1, cycles=3)
    assert SchedulerLease.objects.get().renewed_at == renewed
    env.run(daemon, seconds=3)
    assert SchedulerLease.objects.get().renewed_at > renewed


def _show(name: str) -> str:
    with connection.cursor() as cursor:
        cursor.execute(f"SHOW {name}")
        return str(cursor.fetchone()[0])


@pytest.mark.postgresql("server-side session timeouts and row locks")
def test_the_daemons_loop_runs_with_its_session_timeouts(env: Env, settings: Any) -> None:
    # the test's own transaction is the daemon's session here: an idle timeout a loaded host
    # could reach between two statements would end it (it did at 4 s, load 17)
    settings.GANTRY_DAEMON_IDLE_IN_TRANSACTION_TIMEOUT_MS = 240000
    settings.GANTRY_DAEMON_STATEMENT_TIMEOUT_MS = 300000
    settings.GANTRY_DAEMON_LOCK_TIMEOUT_MS = 1500
    seen: dict[str, str] = {}

    def look(daemon: Daemon) -> None:
        daemon.stop.set()  # first: the loop ends whatever this finds
        seen.update({name: _show(name) for name in [*session_settings(), "plan_cache_mode"]})

    daemon = env.daemon(on_cycle=look)
    daemon.run()
    assert seen == {
        "idle_in_transaction_session_timeout": "4min",
        "statement_timeout": "5min",
        "lock_timeout": "1500ms",
        "plan_cache_mode": "auto",  # generic plans kept where they cost no more
    }
    # the web's settings again once the loop ends
    assert _show("lock_timeout") == "5s"
    assert _show("plan_cache_mode") == "force_custom_plan"


@pytest.mark.postgresql("server-side session timeouts and row locks")
def test_a_leader_frozen_inside_its_write_is_cut_off_and_a_standby_takes_over(
    tenv: Env,
) -> None:
    """The leader's session, configured as the daemon's are (with a short idle timeout for
    the test), freezes inside a fenced write: the lease row stays locked FOR SHARE. The
    standby is refused at once while it is; the server ends the frozen session, which
    releases the lock, and the standby takes over."""
    leader = tenv.daemon("leader")
    assert leader.lease.acquire()
    expire_leases()  # the leader stops renewing: frozen
    standby = tenv.daemon("standby")
    frozen: Any = pg()
    try:
        short = {**session_settings(), "idle_in_transaction_session_timeout": 200}
        configure_session(frozen.cursor(), short)
        frozen.execute("BEGIN")
        frozen.execute("SELECT 1 FROM scheduler_schedulerlease FOR SHARE")  # then SIGSTOP
        assert standby.lease.acquire() is False  # refused at once, not after a lock wait
        # Wait for the lock the way a takeover UPDATE would, bounded by lock_timeout (5 s):
        # it is granted once the server has ended the frozen session.
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1 FROM scheduler_schedulerlease FOR UPDATE")
        assert standby.lease.acquire() is True
        assert SchedulerLease.objects.get().holder == "standby"
    finally:
        frozen.close()


class Monotonic:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.mark.parametrize("slow", ["write_starts", "write_reasons"])
def test_a_slow_phase_after_the_binds_does_not_let_the_lease_lapse(
    env: Env, monkeypatch: pytest.MonkeyPatch, slow: str
) -> None:
    """A phase after the commit that takes more than a third of the TTL is followed by a
    renewal before the next phase writes (the phases after the binds used to write on the
    renewal made before the bind)."""
    daemon = env.daemon()
    env.run(daemon)  # leading
    monotonic = Monotonic()
    daemon.keeper.monotonic = monotonic
    daemon.keeper.mark_renewed()
    renewals: list[str] = []
    renew = daemon.lease.renew

    def counted(*args: Any, **kwargs: Any) -> bool:
        renewals.append("renew")
        return renew(*args, **kwargs)

    monkeypatch.setattr(daemon.lease, "renew", counted)
    real = getattr(loop, slow)
    order: list[str] = []

    def slow_phase(*args: Any, **kwargs: Any) -> Any:
        order.append(slow)
        monotonic.now += daemon.lease.ttl_s / 3 + 1  # this phase took longer than that
        return real(*args, **kwargs)

    monkeypatch.setattr(loop, slow, slow_phase)
    renewals_at_slow = 0

    def statistics(now: float) -> list[str]:
        order.append("statistics")
        nonlocal renewals_at_slow
        renewals_at_slow = len(renewals)
        return []

    monkeypatch.setattr(daemon.statistics, "refresh", statistics)
    env.submit(simulation={"duration_s": 600})
    daemon.step()
    assert order == [slow, "statistics"]
    assert renewals_at_slow >= 1  # renewed after the slow phase, before the next one
    assert daemon.lease.leading


def test_a_failed_fence_forgets_the_epoch_unless_told_not_to(env: Env) -> None:
    """The loop's own fence forgets a lost epoch (it stands by); the estimates' thread
    beside it fences with forget=False and leaves the loop's lease to the loop."""
    daemon = env.daemon()
    env.run(daemon)
    epoch = daemon.lease.epoch
    assert epoch is not None
    expire_leases()
    env.daemon("successor").lease.acquire()
    with pytest.raises(LeaseLost):
        daemon.lease.fence(forget=False)
    assert daemon.lease.epoch == epoch
    with pytest.raises(LeaseLost):
        daemon.lease.fence()
    assert daemon.lease.epoch is None
