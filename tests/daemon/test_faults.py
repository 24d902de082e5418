"""docs/faults.md 1-7, 20, 21 and the crash matrix: kill the daemon at each step of a cycle and
start a new one on the same database and cluster; leadership, fencing, lost connections,
locked rows and a misbehaving backend."""

from __future__ import annotations

import time
from typing import Any

import psycopg
import pytest
from django.db import connection, transaction
from django.db.models.functions import Now

from scheduler.backends.base import BackendError, BindConflict
from scheduler.daemon.wakeup import Waiter
from scheduler.jobs.services import job_cancel
from scheduler.leader import LeaseLost
from scheduler.models import Allocation, Job, JobEvent, SchedulerLease
from tests.daemon.conftest import Env, Killed, assert_consistent, expire_leases


def _raise() -> None:
    raise Killed


def pg() -> Any:
    params = connection.get_connection_params()
    for key in ("cursor_factory", "context", "server_side_binding"):
        params.pop(key, None)
    return psycopg.connect(**params, autocommit=True)


# --- crash at each step ------

# step -> (attempt the job runs under, how many pods were ever created)
CRASHES = {
    "claimed": (1, 0),  # FAULT 1: claim released, attempt raised, no pod was made
    "pods_created": (0, 1),  # FAULT 2: the next leader adopts the pod and binds it
    "bound": (0, 1),  # FAULT 3: reconcile sees the pod's node and records it
    "before_commit": (0, 1),  # FAULT 3, with the commit rolled back
}


@pytest.mark.parametrize("step", list(CRASHES))
def test_killed_at_each_step_loses_nothing(env: Env, step: str) -> None:
    job = env.submit(simulation={"duration_s": 600})
    first = env.daemon("first", hooks={step: _raise})
    with pytest.raises(Killed):
        first.step()
    expire_leases()
    second = env.daemon("second")
    env.run(second, cycles=2)
    job.refresh_from_db()
    attempt, created = CRASHES[step]
    assert job.state in ("binding", "running"), job.state
    assert job.attempt == attempt
    assert env.backend.calls.get("create_pod", 0) == created + (attempt > 0)
    pods = [p for p in env.backend.list_pods() if not p.deleting]
    assert [p.name for p in pods] == [f"gantry-{job.pk}-a{attempt}-r0"]
    assert Allocation.objects.filter(ended_at__isnull=True).count() == 1
    assert_consistent(env.backend)
    env.run(second, seconds=2)
    job.refresh_from_db()
    assert job.state == "running"


# --- leadership ------


def test_two_daemons_only_one_acts_and_standby_takes_over(env: Env) -> None:
    job = env.submit(simulation={"duration_s": 600})
    leader, standby = env.daemon("leader"), env.daemon("standby")
    env.run(leader)
    events = JobEvent.objects.count()
    assert standby.step() is False
    assert standby.cycle_no == 0 and not standby.lease.leading
    assert JobEvent.objects.count() == events
    expire_leases()  # the leader died; its lease ran out
    env.run(standby)
    assert standby.lease.leading and standby.lease.epoch == 2
    second = env.submit(simulation={"duration_s": 600})
    env.run(standby)
    second.refresh_from_db()
    job.refresh_from_db()
    assert second.state == "binding" and job.state == "binding"
    assert SchedulerLease.objects.get().holder == "standby"


def test_standby_inherits_the_leaders_fair_share_history(env: Env) -> None:
    env.submit(simulation={"duration_s": 6000})  # 4 GPUs of team-alpha, running a while
    leader = env.daemon("leader")
    env.run(leader, seconds=10, cycles=4)  # usage accrues; each step renews, saving it
    saved = SchedulerLease.objects.get().fair_share["decayed"]  # as of its last renewal
    assert saved.get("team-alpha", 0) > 0, saved
    expire_leases()  # the leader died without stepping down
    standby = env.daemon("standby")
    env.run(standby)
    # The standby starts from the saved history, decayed by the time since (a 24 h default
    # half-life: next to nothing over these seconds), and adds its own; not from zero.
    assert standby.decayed["team-alpha"] >= 0.99 * saved["team-alpha"], standby.decayed


def test_stale_leader_write_is_rejected(env: Env) -> None:  # FAULT 4
    stale = env.daemon("stale")
    env.run(stale)
    job = env.submit(simulation={"duration_s": 600})
    expire_leases()
    fresh = env.daemon("fresh")
    assert fresh.lease.acquire() and fresh.lease.epoch == 2
    before = (JobEvent.objects.count(), Allocation.objects.count())
    with pytest.raises(LeaseLost):
        stale.cycle()  # paused past its lease; wakes up and tries to write
    job.refresh_from_db()
    assert job.state == "queued"
    assert (JobEvent.objects.count(), Allocation.objects.count()) == before
    with pytest.raises(LeaseLost), transaction.atomic():
        stale.lease.epoch = 1
        stale.lease.fence()


@pytest.mark.postgresql("row locks seen from another session")
def test_a_leader_stopped_in_its_copy_does_not_hold_the_lease(
    tenv: Env, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The fence comes last in a write (`Lease.writing`): while the claim's allocations and
    device shares are copied, the lease row is not locked, so a leader stopped there (a
    session waiting for a COPY's rows, which no server timeout ends) does not keep a standby
    out. The write still commits under the fence."""
    from scheduler.daemon import store

    tenv.submit(simulation={"duration_s": 600})
    leader = tenv.daemon("leader")
    seen: list[str] = []
    copy = store.copy_rows

    def copying(*args: Any, **kwargs: Any) -> None:
        with pg() as other:
            try:
                other.execute("SELECT 1 FROM scheduler_schedulerlease FOR UPDATE NOWAIT")
                seen.append("free")
            except psycopg.errors.LockNotAvailable:
                seen.append("held")
        copy(*args, **kwargs)

    monkeypatch.setattr(store, "copy_rows", copying)
    tenv.run(leader)
    assert seen and set(seen) == {"free"}, seen
    assert Allocation.objects.filter(ended_at__isnull=True).count() == 1


def test_lease_uses_the_database_clock(env: Env) -> None:  # FAULT 21
    daemon = env.daemon()
    env.clock.advance(10 * 365 * 86400)  # the daemon's clock is years off
    assert daemon.lease.acquire()
    lease = SchedulerLease.objects.get()
    db_now = SchedulerLease.objects.annotate(db_now=Now()).values_list("db_now", flat=True).get()
    assert lease.renewed_at is not None and lease.expires_at is not None
    assert abs((lease.renewed_at - db_now).total_seconds()) < 5
    assert (lease.expires_at - lease.renewed_at).total_seconds() == pytest.approx(30)
    assert lease.expires_at.tzinfo is not None
    assert daemon.lease.renew()


# --- the database ------


@pytest.mark.postgresql("a server backend killed (pg_terminate_backend)")
def test_connection_killed_mid_run_daemon_reconnects(tenv: Env) -> None:  # FAULT 5
    daemon = tenv.daemon()
    tenv.run(daemon)
    job = tenv.submit(simulation={"duration_s": 600})
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()")
        pid = cursor.fetchone()[0]
    with pg() as other:
        other.execute("SELECT pg_terminate_backend(%s)", [pid])
    assert daemon.step() is False  # the error is caught; leadership dropped
    assert not daemon.lease.leading
    tenv.run(daemon)  # reconnects, re-takes the lease with a new epoch, rescans
    assert daemon.lease.epoch == 2
    job.refresh_from_db()
    assert job.state == "binding"
    assert Allocation.objects.filter(job=job).count() == 1
    assert_consistent(tenv.backend)


@pytest.mark.postgresql("LISTEN/NOTIFY")
def test_listen_connection_dies_polling_still_schedules(tenv: Env) -> None:  # FAULT 6
    daemon = tenv.daemon()
    tenv.run(daemon)
    waiter = Waiter()
    assert waiter.wait(0.01) == "timeout"
    tenv.submit(simulation={"duration_s": 600})
    assert waiter.wait(2.0) == "notify"  # the trigger's NOTIFY on a queued job
    with pg() as other:
        other.execute("SELECT pg_terminate_backend(%s)", [waiter.backend_pid()])
    job = tenv.submit(simulation={"duration_s": 600})
    assert waiter.wait(0.05) in ("error", "timeout")  # no wake-up: polling fallback
    tenv.run(daemon)
    job.refresh_from_db()
    assert job.state == "binding"
    third = tenv.submit(simulation={"duration_s": 600})
    assert waiter.wait(0.01) in ("timeout", "notify")  # reconnected
    tenv.run(daemon)
    third.refresh_from_db()
    assert third.state == "binding"
    waiter.close()


@pytest.mark.postgresql("row locks (SKIP LOCKED) and server timeouts")
def test_locked_job_is_skipped_and_timeouts_are_set(tenv: Env) -> None:  # FAULT 7
    locked = tenv.submit(simulation={"duration_s": 600})
    free = tenv.submit(simulation={"duration_s": 600})
    with connection.cursor() as cursor:
        cursor.execute("SHOW lock_timeout")
        assert cursor.fetchone()[0] == "5s"
        cursor.execute("SHOW statement_timeout")
        assert cursor.fetchone()[0] == "30s"
    daemon = tenv.daemon()
    with pg() as other, other.transaction():
        other.execute("SELECT id FROM scheduler_job WHERE id = %s FOR UPDATE", [locked.pk])
        tenv.run(daemon)
        free.refresh_from_db()
        locked.refresh_from_db()
        assert free.state == "binding"
        assert locked.state == "queued"
        assert not Allocation.objects.filter(job=locked).exists()
    tenv.run(daemon)
    locked.refresh_from_db()
    assert locked.state == "binding"
    assert_consistent(tenv.backend)


@pytest.mark.postgresql("the lease row's share lock")
def test_takeover_does_not_happen_during_the_fenced_write_in_flight(tenv: Env) -> None:
    """The leader's write transaction holds the lease FOR SHARE: a takeover cannot happen
    until it commits, so the write lands under the epoch that made it, or not at all. The
    takeover does not wait for it either (NOWAIT): it is refused at once and tried again."""
    leader = tenv.daemon("leader")
    assert leader.lease.acquire()
    expire_leases()
    usurper = tenv.daemon("usurper")
    with pg() as other, connection.cursor() as cursor:
        other.execute("BEGIN")
        other.execute(
            "SELECT 1 FROM scheduler_schedulerlease WHERE epoch = 1 FOR SHARE"
        )  # as fence() does
        cursor.execute("SET lock_timeout = '20s'")  # a wait on the row would show
        try:
            started = time.monotonic()
            assert usurper.lease.acquire() is False
            assert time.monotonic() - started < 10  # refused at once, not after a lock wait
        finally:
            cursor.execute("RESET lock_timeout")
        assert SchedulerLease.objects.get().epoch == 1
        other.execute("COMMIT")
    assert usurper.lease.acquire() is True
    assert SchedulerLease.objects.get().epoch == 2


# --- the cluster backend ------


def test_backend_errors_are_retried_with_backoff(env: Env) -> None:
    job = env.submit(simulation={"duration_s": 600})
    env.backend.inject("create_pod", BackendError("503 Service Unavailable"), times=2)
    env.backend.inject("bind_pod", BackendError("timeout", retry_after_s=1.0), times=1)
    daemon = env.daemon()
    env.run(daemon)
    job.refresh_from_db()
    assert job.state == "binding"
    assert env.backend.calls["create_pod"] == 3 and env.backend.calls["bind_pod"] == 2
    assert_consistent(env.backend)


def test_backend_down_requeues_with_backoff_nothing_lost(env: Env) -> None:
    job = env.submit(simulation={"duration_s": 600})
    env.backend.inject("bind_pod", BackendError("500 Internal Server Error"), times=4)
    daemon = env.daemon()
    env.run(daemon)
    job.refresh_from_db()
    assert (job.state, job.attempt) == ("queued", 1)
    assert "bind failed" in job.reason
    assert not Allocation.objects.filter(ended_at__isnull=True).exists()
    env.run(daemon, seconds=1)  # inside the 5 s backoff
    job.refresh_from_db()
    assert job.state == "queued"
    env.run(daemon, seconds=5)
    job.refresh_from_db()
    assert job.state == "binding"
    assert_consistent(env.backend)


def test_foreign_pod_holding_our_name_is_left_alone_and_job_requeued(env: Env) -> None:
    job = env.submit(simulation={"duration_s": 600})
    env.backend.inject("create_pod", BindConflict("a foreign pod holds the name"))
    daemon = env.daemon()
    env.run(daemon)
    job.refresh_from_db()
    assert (job.state, job.attempt) == ("queued", 1)
    assert "foreign pod" in job.reason
    assert env.backend.calls.get("delete_pod", 0) == 0  # never delete what is not ours
    assert not Allocation.objects.filter(ended_at__isnull=True).exists()
    assert_consistent(env.backend)


def test_bind_conflict_on_another_node_frees_the_reservation(env: Env) -> None:
    job = env.submit(simulation={"duration_s": 600})
    env.backend.inject("bind_pod", BindConflict("already bound", bound_node="elsewhere"))
    daemon = env.daemon()
    env.run(daemon)
    job.refresh_from_db()
    assert job.state == "queued" and "bound to elsewhere" in job.reason
    assert not Allocation.objects.filter(ended_at__isnull=True).exists()
    env.run(daemon, seconds=6)
    job.refresh_from_db()
    assert job.state == "binding"
    assert_consistent(env.backend)


def test_list_pods_failing_skips_the_cycle_and_keeps_state(env: Env) -> None:
    job = env.submit(simulation={"duration_s": 600})
    daemon = env.daemon()
    env.run(daemon)
    # Every try fails (the cluster retries its own transient failures `policy.attempts` times).
    env.backend.inject("list_pods", BackendError("connection reset"), env.backend.policy.attempts)
    env.run(daemon, seconds=2)
    job.refresh_from_db()
    assert job.state == "binding"
    env.run(daemon)
    job.refresh_from_db()
    assert job.state == "running"


# --- concurrency ------


def test_cancel_racing_bind_leaves_no_pod(env: Env) -> None:  # FAULT 20
    job = env.submit(simulation={"duration_s": 600})
    user = env.org.users["alice"]

    def cancel() -> None:
        job_cancel(user=user, job=Job.objects.get(pk=job.pk))

    daemon = env.daemon(hooks={"claimed": cancel})
    env.run(daemon)
    daemon.hooks = {}
    job.refresh_from_db()
    assert job.state == "cancelled"
    env.run(daemon, seconds=3, cycles=2)
    assert [p for p in env.backend.list_pods()] == []
    assert not Allocation.objects.filter(ended_at__isnull=True).exists()
    assert_consistent(env.backend)


def test_sigterm_finishes_the_current_cycle_then_steps_down(env: Env) -> None:
    job = env.submit(simulation={"duration_s": 600})
    daemon = env.daemon()
    daemon.hooks = {"claimed": daemon.stop.set}  # SIGTERM arrives mid-cycle
    daemon.run()
    job.refresh_from_db()
    assert job.state == "binding"  # the cycle was finished: bound and committed
    assert daemon.cycle_no == 1 and not daemon.lease.leading
    standby = env.daemon("standby")
    assert standby.lease.acquire()  # released at once: no wait for expiry
    assert_consistent(env.backend)
