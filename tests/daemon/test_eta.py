"""Queue positions and start estimates, refreshed by the leading daemon (scheduler/eta.py)."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from django.db import connection

from scheduler import eta as eta_module
from scheduler.core import queue_order, run_cycle
from scheduler.daemon.loop import Daemon
from scheduler.daemon.snapshot import build_snapshot
from scheduler.eta import EtaRefresher, EtaSettings, refresh_estimates, runtime_history
from scheduler.leader import LeaseLost
from scheduler.models import Allocation, Job, JobQueueEstimate, JobState
from scheduler.services import job_cancel
from tests import factories as f
from tests.daemon.conftest import LOOP_WATCHDOG_S, Env, expire_leases, make_env, watched

SETTINGS = EtaSettings(every_s=30.0, budget_s=5.0, max_jobs=100, unbounded_runtime_s=14400.0)


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
    done = _refresh(env, SETTINGS, monotonic=lambda: float(next(ticks)))
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

    monkeypatch.setattr("scheduler.eta.refresh_estimates", broken)
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


def _gated(monkeypatch: pytest.MonkeyPatch) -> tuple[threading.Event, threading.Event, list[int]]:
    """refresh_estimates held until `release` is set; `entered` is set when one starts, and
    `calls` counts them."""
    entered, release, calls = threading.Event(), threading.Event(), []
    real = eta_module.refresh_estimates

    def held(*args: Any, **kwargs: Any) -> Any:
        calls.append(1)
        entered.set()
        assert release.wait(LOOP_WATCHDOG_S), "the test never released the refresh"
        return real(*args, **kwargs)

    monkeypatch.setattr(eta_module, "refresh_estimates", held)
    return entered, release, calls


def test_in_the_background_the_loop_goes_on_while_the_refresh_runs(
    tenv: Env, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The daemon's loop on PostgreSQL refreshes on a thread of its own: cycles go on while
    a refresh runs, a refresh due meanwhile is not started twice, and the estimates are
    written once it is done."""
    env = tenv
    for _ in range(4):
        env.submit(resources={"gpus": 8}, max_runtime_s=4000)
    waiting = env.submit(resources={"gpus": 8}, max_runtime_s=4000)
    entered, release, calls = _gated(monkeypatch)
    daemon = env.daemon()
    daemon.estimates = EtaRefresher(SETTINGS)
    daemon.estimates.start_background()
    try:
        env.run(daemon)  # places the four; the refresh starts and is held
        assert entered.wait(LOOP_WATCHDOG_S)
        env.run(daemon, seconds=31, cycles=3)  # the loop is not held; due again meanwhile
        assert daemon.cycle_no == 4 and len(calls) == 1
        assert not JobQueueEstimate.objects.exists()
        release.set()
    finally:
        release.set()
        daemon.estimates.close()
    assert JobQueueEstimate.objects.get(job=waiting).position_cluster == 1
    assert _due(daemon) is not None  # closed: in the loop again, and due
    assert len(calls) == 2


def test_a_background_refresh_that_fails_is_logged_and_writes_nothing(
    tenv: Env, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
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
