"""Queue positions and start estimates, refreshed by the leading daemon
(scheduler/estimates/refresh.py)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import psycopg
import pytest
from django.db import connection

from scheduler.core import queue_order, run_cycle
from scheduler.daemon.loop import Daemon
from scheduler.estimates.refresh import (
    EtaRefresher,
    EtaSettings,
    refresh_estimates,
    runtime_history,
)
from scheduler.jobs.services import job_cancel
from scheduler.leader import LeaseLost
from scheduler.models import Allocation, Job, JobQueueEstimate, JobState
from scheduler.sim.calibration import Calibration, EstimateLog, corrected, score
from scheduler.snapshot.build import build_snapshot
from tests import factories as f
from tests.daemon.conftest import LOOP_WATCHDOG_S, Env, expire_leases, make_env, watched

# A budget no loaded host spends: the wall clock must not decide what a test sees (at load 17
# a refresh with arrivals ran past 5 s on SQLite and kept no estimate); the budget's own test
# sets 5 s with a fake clock.
SETTINGS = EtaSettings(every_s=30.0, budget_s=600.0, max_jobs=100, unbounded_runtime_s=14400.0)


@pytest.fixture
def five_nodes(db: Any) -> Iterator[Env]:
    yield from watched(make_env(nodes=5))


@pytest.fixture
def one_node(db: Any) -> Iterator[Env]:
    yield from watched(make_env(nodes=1))


def _dt(at: float) -> datetime:
    return datetime.fromtimestamp(at, tz=UTC)


def _full_cluster(env: Env) -> tuple[Daemon, list[Job]]:
    """5 nodes x 8 GPUs held by 8-GPU jobs, three of alpha's and two of bravo's (placed by
    the daemon's first cycle, its refresh due again in 30 s); then b1 (bravo), a1, a2
    (alpha), b2 (bravo) wait, 4 GPUs each. Returns the waiting ones in submission order.
    Both teams hold at least their guarantee (16 GPUs): nobody may reclaim."""
    for user in ["alice", "alice", "alice", "bob-bravo", "bob-bravo"]:
        env.submit(user, resources={"gpus": 8})
    daemon = env.daemon()
    daemon.estimates = EtaRefresher(SETTINGS)
    env.run(daemon)
    return daemon, [env.submit(user) for user in ["bob-bravo", "alice", "alice", "bob-bravo"]]


def _positions() -> dict[int, tuple[int, int]]:
    return {
        e.job_id: (e.position_tenant, e.position_cluster) for e in JobQueueEstimate.objects.all()
    }


def test_positions_follow_the_engines_order(five_nodes: Env) -> None:
    env = five_nodes
    daemon, (b1, a1, a2, b2) = _full_cluster(env)
    env.run(daemon, seconds=30)
    # One class: fair share decides before age. Alpha holds 24 GPUs of a 16-GPU guarantee
    # (1.5), bravo 16 of 16 (1.0), and nothing is admitted while ordering: bravo's b1, b2,
    # then alpha's a1, a2, although a1 and a2 are older than b2.
    assert _positions() == {b1.pk: (1, 1), b2.pk: (2, 2), a1.pk: (1, 3), a2.pk: (2, 4)}
    # The engine's own order over the same snapshot, and the order its cycle handles them in.
    snap = build_snapshot(env.clock(), decayed=daemon.decayed).snapshot
    engine = [int(j.id) for j in queue_order(snap, daemon.profile)]
    handled = [int(w.job_id) for w in run_cycle(snap, daemon.profile).waiting]
    by_position = sorted(_positions(), key=lambda job_id: _positions()[job_id][1])
    assert by_position == engine == handled


def test_a_job_that_leaves_the_queue_loses_its_position(five_nodes: Env) -> None:
    env = five_nodes
    daemon, (b1, a1, a2, b2) = _full_cluster(env)
    env.run(daemon, seconds=30)
    job_cancel(user=env.org.users["bob-bravo"], job=b1, reason="")
    env.run(daemon, seconds=30)
    assert _positions() == {b2.pk: (1, 1), a1.pk: (1, 2), a2.pk: (2, 3)}


def test_an_empty_queue_drops_every_position(five_nodes: Env) -> None:
    """The last queued job gone: no position is left (the ids to keep are an empty list)."""
    env = five_nodes
    daemon, _ = _full_cluster(env)
    env.run(daemon, seconds=30)
    assert _positions()
    for job in Job.objects.filter(state=JobState.QUEUED):
        job_cancel(user=job.submitted_by, job=job, reason="")
    env.run(daemon, seconds=30)
    assert not Job.objects.filter(state=JobState.QUEUED).exists()
    assert _positions() == {}


def _history(env: Env, count: int, ran_s: float, max_s: int, **job: Any) -> None:
    """`count` finished jobs of alpha's project that ran `ran_s` of their `max_s`."""
    end = _dt(env.clock() - 3600)
    for _ in range(count):
        f.JobFactory(
            project=env.org.proj_alpha,
            submitted_by=env.org.users["alice"],
            state=JobState.SUCCEEDED,
            max_runtime_s=max_s,
            started_at=end - timedelta(seconds=ran_s),
            finished_at=end,
            **{"gpus_per_replica": 8, "gpu_milli_per_replica": 8000, **job},
        )


def test_estimates_from_the_history_of_similar_jobs(one_node: Env) -> None:
    env = one_node
    # Similar jobs (alpha's project, training, 8 GPUs) ran 1000 s of a 4000 s max: the
    # runner (8 GPUs from its start, max 4000 s) is expected to end at start + 1000 s, and
    # the waiting job to start then (p50 and p90 alike: every ratio is 0.25).
    _history(env, 5, ran_s=1000, max_s=4000)
    # Jobs of another size say nothing while the narrow group has enough history.
    _history(env, 5, ran_s=4000, max_s=4000, gpus_per_replica=1, gpu_milli_per_replica=1000)
    runner = env.submit(resources={"gpus": 8}, max_runtime_s=4000)
    waiting = env.submit(resources={"gpus": 8}, max_runtime_s=4000)
    daemon = env.daemon()
    daemon.estimates = EtaRefresher(SETTINGS)
    env.run(daemon)
    started = Allocation.objects.get(job=runner).started_at
    estimate = JobQueueEstimate.objects.get(job=waiting)
    assert estimate.eta_p50 == estimate.eta_p90 == started + timedelta(seconds=1000)
    assert estimate.estimated_at == _dt(env.clock())


def test_without_history_the_estimate_is_the_max(one_node: Env) -> None:
    env = one_node
    runner = env.submit(resources={"gpus": 8}, max_runtime_s=4000)
    waiting = env.submit(resources={"gpus": 8}, max_runtime_s=4000)
    daemon = env.daemon()
    daemon.estimates = EtaRefresher(SETTINGS)
    env.run(daemon)
    started = Allocation.objects.get(job=runner).started_at
    estimate = JobQueueEstimate.objects.get(job=waiting)
    assert estimate.eta_p50 == estimate.eta_p90 == started + timedelta(seconds=4000)


def test_a_job_without_a_max_runs_as_long_as_similar_jobs_did(one_node: Env) -> None:
    # Similar jobs without a max ran 600 s: the runner (no max either) is expected to end
    # then, not after GANTRY_ETA_UNBOUNDED_RUNTIME_S (4 h here), which is for no history.
    env = one_node
    _history(env, 5, ran_s=600, max_s=None)
    runner = env.submit(resources={"gpus": 8})
    waiting = env.submit(resources={"gpus": 8})
    daemon = env.daemon()
    daemon.estimates = EtaRefresher(SETTINGS)
    env.run(daemon)
    started = Allocation.objects.get(job=runner).started_at
    estimate = JobQueueEstimate.objects.get(job=waiting)
    assert estimate.eta_p50 == estimate.eta_p90 == started + timedelta(seconds=600)


def test_a_requeued_job_still_holding_devices_waits_and_gives_them_back(one_node: Env) -> None:
    # The runner was preempted (or lost its node): queued again, its pods still stopping,
    # so it holds the node's 8 GPUs. The refresh plans what the daemon decided: the devices
    # come back now (not after the runner's 4000 s max) and the runner waits in the queue
    # with a position and an estimate, like any queued job.
    env = one_node
    runner = env.submit(resources={"gpus": 8}, max_runtime_s=4000)
    waiting = env.submit(resources={"gpus": 8}, max_runtime_s=4000)
    daemon = env.daemon()
    daemon.estimates = EtaRefresher(SETTINGS)
    env.run(daemon)
    env.clock.advance(60)
    Job.objects.filter(pk=runner.pk).update(state=JobState.QUEUED, queued_at=_dt(env.clock()))
    assert Allocation.objects.filter(job=runner, ended_at__isnull=True).exists()
    _refresh(env, SETTINGS)
    rows = {e.job_id: e for e in JobQueueEstimate.objects.all()}
    assert set(rows) == {runner.pk, waiting.pk}
    first, second = sorted(rows.values(), key=lambda e: e.position_cluster)
    assert first.eta_p50 == _dt(env.clock())
    # the second waits for the first's 4000 s max (no history)
    assert second.eta_p50 == _dt(env.clock() + 4000)


def test_history_is_read_again_after_its_interval(one_node: Env) -> None:
    # Runtimes come from the history read at most every `history_every_s` of the daemon's
    # clock (bench.eta shortens it): jobs that finish in between count from the next read.
    env = one_node
    runner = env.submit(resources={"gpus": 8}, max_runtime_s=4000)
    waiting = env.submit(resources={"gpus": 8}, max_runtime_s=4000)
    daemon = env.daemon()
    daemon.estimates = EtaRefresher(SETTINGS, history_every_s=60.0)
    env.run(daemon)
    started = Allocation.objects.get(job=runner).started_at
    _history(env, 5, ran_s=1000, max_s=4000)
    env.run(daemon, seconds=30)  # a refresh, the history as read before
    estimate = JobQueueEstimate.objects.get(job=waiting)
    assert estimate.eta_p50 == started + timedelta(seconds=4000)
    assert estimate.estimated_at == _dt(env.clock())
    env.run(daemon, seconds=30)  # a refresh that reads the history again
    estimate = JobQueueEstimate.objects.get(job=waiting)
    assert estimate.eta_p50 == started + timedelta(seconds=1000)


def test_refresh_waits_its_interval(five_nodes: Env) -> None:
    env = five_nodes
    daemon, _ = _full_cluster(env)
    env.run(daemon, seconds=30)
    late = env.submit()
    env.run(daemon, seconds=29)
    assert not JobQueueEstimate.objects.filter(job=late).exists()
    env.run(daemon, seconds=1)
    assert JobQueueEstimate.objects.get(job=late).position_cluster == 5


def _stale(jobs: list[Job]) -> datetime:
    """Rows from an earlier refresh for `jobs`, each with a recognisable estimate."""
    old = datetime(2029, 1, 1, tzinfo=UTC)
    JobQueueEstimate.objects.all().delete()  # the daemon's own refresh made some
    for position, job in enumerate(jobs, start=1):
        JobQueueEstimate.objects.create(
            job=job,
            position_tenant=9,
            position_cluster=position + 10,
            eta_p50=old,
            eta_p90=old,
            estimated_at=old,
            computed_at=old,
        )
    return old


def _refresh(env: Env, config: EtaSettings, monotonic: Any = None) -> Any:
    built = build_snapshot(env.clock(), decayed={})
    model = runtime_history(_dt(env.clock()), config.unbounded_runtime_s)
    extra = {"monotonic": monotonic} if monotonic is not None else {}
    profile = env.daemons[0].profile
    return refresh_estimates(built.snapshot, built.jobs, profile, model, config, **extra)


def test_cap_replays_the_head_of_the_queue_and_keeps_the_rest(five_nodes: Env) -> None:
    env = five_nodes
    _, (b1, a1, a2, b2) = _full_cluster(env)  # the refresh below is the one under test
    old = _stale([b1, a1, a2, b2])
    config = EtaSettings(every_s=30.0, budget_s=5.0, max_jobs=1, unbounded_runtime_s=14400.0)
    done = _refresh(env, config)
    assert (done.positions, done.estimated, done.capped) == (4, 1, 3)
    rows = {e.job_id: e for e in JobQueueEstimate.objects.all()}
    assert rows[b1.pk].estimated_at == _dt(env.clock()) and rows[b1.pk].eta_p50 != old
    for job in (a1, a2, b2):  # beyond the cap: the previous estimate stays
        assert (rows[job.pk].eta_p50, rows[job.pk].estimated_at) == (old, old)
        assert rows[job.pk].computed_at == _dt(env.clock())  # positions are new
    assert _positions() == {b1.pk: (1, 1), b2.pk: (2, 2), a1.pk: (1, 3), a2.pk: (2, 4)}


def test_budget_spent_stops_the_replay_and_keeps_previous_estimates(five_nodes: Env) -> None:
    env = five_nodes
    _, (b1, a1, a2, b2) = _full_cluster(env)
    old = _stale([b1, a1, a2])  # b2 was never estimated
    ticks = iter(range(0, 10_000, 10))  # 10 s of wall time between two looks at the clock
    done = _refresh(env, replace(SETTINGS, budget_s=5.0), monotonic=lambda: float(next(ticks)))
    assert done.stopped and done.estimated == 0
    rows = {e.job_id: e for e in JobQueueEstimate.objects.all()}
    assert [(rows[j.pk].eta_p50, rows[j.pk].estimated_at) for j in (b1, a1, a2)] == [(old, old)] * 3
    assert (rows[b2.pk].eta_p50, rows[b2.pk].estimated_at) == (None, None)
    assert _positions()[b2.pk] == (2, 2)


def test_a_bug_in_the_estimates_does_not_stop_scheduling(
    env: Env, monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken(*_args: Any, **_kwargs: Any) -> Any:
        raise ZeroDivisionError("a bug")

    monkeypatch.setattr("scheduler.estimates.refresh.refresh_estimates", broken)
    job = env.submit()
    daemon = env.daemon()
    env.run(daemon)
    job.refresh_from_db()
    assert job.state == JobState.BINDING
    assert daemon.lease.leading


def _due(daemon: Daemon) -> Any:
    return daemon.estimates.after_cycle(
        now=daemon.clock(),
        decayed=daemon.decayed,
        max_pending=daemon.max_pending,
        per_queue=daemon.per_queue,
        profile=daemon.profile,
        fence=daemon.lease.fence,
    )


def test_a_stale_leader_writes_no_estimates(five_nodes: Env) -> None:
    env = five_nodes
    stale, (b1, _a1, _a2, _b2) = _full_cluster(env)
    expire_leases()
    successor = env.daemon()
    successor.estimates = EtaRefresher(SETTINGS)
    env.run(successor)  # takes the lead and refreshes
    kept = _positions()
    job_cancel(user=env.org.users["bob-bravo"], job=b1, reason="")  # a refresh would differ
    env.clock.advance(30)
    with pytest.raises(LeaseLost):
        _due(stale)
    assert _positions() == kept


@contextmanager
def _estimates_locked() -> Iterator[Callable[[], bool]]:
    """The estimates' table locked against writes (reads go on) from another session until
    the block ends: a background refresh waits at its write. Yields whether a session waits
    for the lock now."""
    with psycopg.connect(**connection.get_connection_params()) as holder:
        holder.execute("LOCK TABLE scheduler_jobqueueestimate IN EXCLUSIVE MODE")

        def waited_for() -> bool:
            row = holder.execute(
                "SELECT count(*) FROM pg_locks WHERE NOT granted"
                " AND relation = 'scheduler_jobqueueestimate'::regclass"
            ).fetchone()
            return bool(row and row[0])

        yield waited_for


def _until(condition: Callable[[], bool]) -> bool:
    """Whether `condition` came true within the watchdog's time (another process's work)."""
    deadline = time.monotonic() + LOOP_WATCHDOG_S
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


@pytest.mark.skipif(connection.vendor != "postgresql", reason="PostgreSQL only: the worker")
def test_in_the_background_the_loop_goes_on_while_the_refresh_runs(
    tenv: Env, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The daemon's loop on PostgreSQL refreshes in a process of its own: cycles go on while
    a refresh runs (held here at its write by a lock), a refresh due meanwhile is not
    started twice, and the estimates are written once it can."""
    monkeypatch.setenv("GANTRY_DAEMON_LOCK_TIMEOUT_MS", str(int(LOOP_WATCHDOG_S * 1000)))
    env = tenv
    for _ in range(4):
        env.submit(resources={"gpus": 8}, max_runtime_s=4000)
    waiting = env.submit(resources={"gpus": 8}, max_runtime_s=4000)
    daemon = env.daemon()
    daemon.estimates = EtaRefresher(SETTINGS)
    daemon.estimates.start_background()
    try:
        with _estimates_locked() as waited_for:
            env.run(daemon)  # places the four; the refresh starts in the worker
            running = daemon.estimates._running
            assert running is not None
            assert _until(waited_for), "the worker's refresh never reached its write"
            env.run(daemon, seconds=31, cycles=3)  # the loop is not held; due again meanwhile
            assert daemon.cycle_no == 4
            assert daemon.estimates._running is running and not running.done()
            assert not JobQueueEstimate.objects.exists()
        assert running.result(LOOP_WATCHDOG_S)[1] == ""
    finally:
        daemon.estimates.close()
    assert JobQueueEstimate.objects.get(job=waiting).position_cluster == 1
    assert daemon.estimates.last is not None and daemon.estimates.last.positions == 1
    assert _due(daemon) is not None  # closed: in the loop again, and due


@pytest.mark.skipif(connection.vendor != "postgresql", reason="PostgreSQL only: the worker")
def test_a_worker_that_died_is_replaced_at_the_next_refresh(
    tenv: Env, caplog: pytest.LogCaptureFixture
) -> None:
    env = tenv
    for _ in range(5):
        env.submit(resources={"gpus": 8}, max_runtime_s=4000)
    daemon = env.daemon()
    daemon.estimates = EtaRefresher(SETTINGS)
    daemon.estimates.start_background()
    try:
        env.run(daemon)
        first = daemon.estimates._running
        assert first is not None and first.result(LOOP_WATCHDOG_S)[1] == ""
        pool = daemon.estimates._pool
        assert pool is not None
        for pid in list(pool._processes):
            os.kill(pid, signal.SIGKILL)
        assert _until(lambda: bool(pool._broken)), "the pool never saw its worker die"
        JobQueueEstimate.objects.all().delete()
        env.run(daemon, seconds=31)
        again = daemon.estimates._running
        assert again is not None and again.result(LOOP_WATCHDOG_S)[1] == ""
        assert daemon.estimates._pool is not pool
    finally:
        daemon.estimates.close()
    assert "worker died: starting another" in caplog.text
    assert JobQueueEstimate.objects.count() == 1  # written by the new worker


def test_the_worker_is_set_up_when_the_background_starts_not_at_the_first_refresh() -> None:
    """A worker's start (Django's set-up: seconds on a loaded host) is paid when the
    background starts, not by the first estimates."""
    refresher = EtaRefresher(SETTINGS)
    refresher.start_background()
    try:
        pool = refresher._pool
        assert pool is not None and pool._processes  # spawned before any refresh was asked
        worker = refresher.wait_ready(LOOP_WATCHDOG_S)
        assert worker in pool._processes and worker != os.getpid()
        assert refresher._running is None
    finally:
        refresher.close()
    with pytest.raises(RuntimeError, match="start_background first"):
        refresher.wait_ready(1)


_DAEMON_THEN_KILLED = """
import os, sys, time

def main():
    import django
    django.setup()
    from scheduler.estimates.refresh import EtaRefresher
    refresher = EtaRefresher()
    refresher.start_background()
    print(refresher._pool.submit(os.getpid).result(60), flush=True)
    time.sleep(600)

if __name__ == "__main__":
    main()
"""


def test_the_worker_ends_when_the_daemon_is_killed(tmp_path: Any) -> None:
    """A daemon killed (SIGKILL) cannot stop its estimates' worker, which would otherwise
    wait for work for ever: the worker sees its parent gone and ends."""
    script = tmp_path / "daemon.py"
    script.write_text(_DAEMON_THEN_KILLED)
    with subprocess.Popen(
        [sys.executable, str(script)],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])},
    ) as daemon:
        try:
            assert daemon.stdout is not None
            worker = int(daemon.stdout.readline())
        finally:
            daemon.kill()

    def gone() -> bool:
        try:
            os.kill(worker, 0)
        except ProcessLookupError:
            return True
        return False

    assert _until(gone), f"the worker {worker} outlived its daemon"


_WORKER_OF_A_DEAD_DAEMON = """
import time
from scheduler.estimates import worker as eta_worker

eta_worker.start({dead}, "config.settings", {{}}, (30.0, 2.0, 100, 14400.0), 600.0)
time.sleep(600)
"""


def test_a_worker_whose_daemon_died_before_its_set_up_ends(tmp_path: Any) -> None:
    """The daemon killed while its worker was still starting: the worker, set up already
    orphaned, compares its parent with the daemon's pid it was given, and ends."""
    with subprocess.Popen([sys.executable, "-c", "pass"]) as gone:
        gone.wait()
    script = tmp_path / "worker.py"
    script.write_text(_WORKER_OF_A_DEAD_DAEMON.format(dead=gone.pid))
    with subprocess.Popen(
        [sys.executable, str(script)],
        env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])},
    ) as worker:
        try:
            assert worker.wait(LOOP_WATCHDOG_S) == 0
        finally:
            worker.kill()


@pytest.mark.skipif(connection.vendor != "postgresql", reason="PostgreSQL only: the worker")
def test_a_background_refresh_that_fails_is_logged_and_writes_nothing(
    tenv: Env, caplog: pytest.LogCaptureFixture
) -> None:
    """The worker's refresh fails at its fence (a lost lease): the daemon's process logs
    why, and nothing is written."""
    env = tenv
    for _ in range(5):
        env.submit(resources={"gpus": 8}, max_runtime_s=4000)
    daemon = env.daemon()
    daemon.estimates = EtaRefresher(SETTINGS)
    env.run(daemon)  # a refresh in the loop: the fifth job's estimate
    kept = _positions()
    assert kept
    job_cancel(user=env.org.users["alice"], job=Job.objects.get(state="queued"), reason="")
    expire_leases()  # the fence of the refresh's write fails: a lost lease
    daemon.estimates.start_background()
    try:
        env.clock.advance(31)
        assert _due(daemon) is None
    finally:
        daemon.estimates.close()
    assert "queue estimates not refreshed: epoch" in caplog.text
    assert _positions() == kept  # a refresh would have dropped the cancelled job's row


def test_the_daemons_loop_refreshes_in_the_background_on_postgresql_only(
    tenv: Env, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`Daemon.run` starts the background thread where the database is PostgreSQL, and
    stops it when the loop ends."""
    started: list[bool] = []
    real = EtaRefresher.start_background

    def spy(self: EtaRefresher) -> None:
        started.append(True)
        real(self)

    monkeypatch.setattr(EtaRefresher, "start_background", spy)
    daemon = tenv.daemon()
    daemon.stop.set()  # the loop ends at once; its set-up and clean-up still run
    daemon.run()
    assert started == ([True] if connection.vendor == "postgresql" else [])
    assert daemon.estimates._pool is None


@pytest.mark.parametrize("calibrated", [True, False], ids=["with-record", "without"])
def test_estimates_are_corrected_by_the_record_of_past_starts(
    one_node: Env, calibrated: bool
) -> None:
    # No history: the runner is expected to run its 4000 s max and `first` to start then.
    # It is cancelled a second later and `first` starts a second after that, before the
    # next refresh: the record pairs the one estimate of `first` (a wait of 4000 s) with
    # the 2 s it waited. `second`, then waiting behind `first` (max 4000 s, no history), is
    # estimated by the replay at first's start + 4000 s and moved by that score: the record
    # learnt that this kind of job starts far sooner than the max says.
    env = one_node
    runner = env.submit(resources={"gpus": 8}, max_runtime_s=4000)
    first = env.submit(resources={"gpus": 8}, max_runtime_s=4000)
    daemon = env.daemon()
    record = EstimateLog(Calibration(floor_s=30.0, min_pairs=1)) if calibrated else None
    daemon.estimates = EtaRefresher(SETTINGS, record=record)
    env.run(daemon)
    made_at = env.clock()
    predicted = JobQueueEstimate.objects.get(job=first).eta_p50
    assert predicted is not None
    job_cancel(user=env.org.users["alice"], job=runner, reason="")
    second = env.submit(resources={"gpus": 8}, max_runtime_s=4000)
    for _ in range(10):  # the runner stops and first is admitted; no refresh due meanwhile
        env.run(daemon, seconds=1)
        if Allocation.objects.filter(job=first).exists():
            break
    started = Allocation.objects.get(job=first).started_at
    env.run(daemon, seconds=30)  # the refresh
    estimate = JobQueueEstimate.objects.get(job=second)
    assert estimate.estimated_at == _dt(env.clock()) and estimate.eta_p50 is not None
    replay = started + timedelta(seconds=4000)  # first runs its max, then second starts
    if not calibrated:
        assert estimate.eta_p50 == replay
        return
    # first waited a few seconds (the cycles of the stop): with 3 s, the score is
    # (3 - 4000) / (4000 + 30) = -0.992, and the replay's wait of second, w = 4000 - 30 s
    # at the refresh, is moved to w - 0.992 * (w + 30) = 3 s
    waited = started.timestamp() - made_at
    assert 0 < waited < 10 and predicted == _dt(made_at + 4000)
    residual = score(made_at, predicted.timestamp(), started.timestamp(), 30.0)
    assert residual == pytest.approx((waited - 4000) / 4030)
    now = env.clock()
    assert estimate.eta_p50.timestamp() == pytest.approx(
        corrected(now, replay.timestamp(), residual, 30.0), abs=1e-3
    )
    assert estimate.eta_p50 < _dt(now + 10)
