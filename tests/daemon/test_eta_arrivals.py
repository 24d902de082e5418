"""Start estimates that expect arrivals like the recent ones (scheduler/estimates/arrivals.py)."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from scheduler.estimates.arrivals import arrivals_expected, recent_streams
from scheduler.estimates.refresh import EtaRefresher, job_groups
from scheduler.models import Allocation, Job, JobQueueEstimate, JobState
from tests import factories as f
from tests.daemon.conftest import Env, make_env, watched
from tests.daemon.test_eta import SETTINGS


@pytest.fixture
def one_node(db: Any) -> Iterator[Env]:
    yield from watched(make_env(nodes=1))


def _submitted(env: Env, ago_s: float, *, state: str = JobState.SUCCEEDED, **job: Any) -> Job:
    """A job of bravo's project created `ago_s` before the clock (8 GPUs, high, max 2000 s)."""
    made = f.JobFactory(
        project=env.org.proj_bravo,
        submitted_by=env.org.users["bob-bravo"],
        state=state,
        priority_class=f.priority("high"),
        max_runtime_s=2000,
        **{"gpus_per_replica": 8, "gpu_milli_per_replica": 8000, **job},
    )
    Job.objects.filter(pk=made.pk).update(created_at=_at(env, ago_s))
    return made


def _at(env: Env, ago_s: float) -> datetime:
    return datetime.fromtimestamp(env.clock() - ago_s, tz=UTC)


def test_the_streams_are_of_the_jobs_created_in_the_window(one_node: Env) -> None:
    # 5000 s ago is out of the hour; 1500 and 500 s ago (queued or finished alike) are one
    # stream, its pace from their creation (a requeue is no arrival), whatever their queue time
    env = one_node
    _submitted(env, 5000)
    first, second = _submitted(env, 1500), _submitted(env, 500, state=JobState.QUEUED)
    Job.objects.filter(pk=second.pk).update(queued_at=_at(env, 10))
    streams, groups = recent_streams(env.clock(), 3600, job_groups)
    assert [(s.template.id, s.last_s, s.gap_s) for s in streams] == [
        (str(second.pk), env.clock() - 500, 1000.0)
    ]
    assert streams[0].template.priority_class == "high"
    assert set(groups) == {str(first.pk), str(second.pk)}


def test_the_next_arrival_continues_the_stream(one_node: Env) -> None:
    # created 1500 and 500 s ago: one every 1000 s, the next 500 s from now, then every
    # 1000 s within the hour
    env = one_node
    _submitted(env, 1500)
    latest = _submitted(env, 500)
    found, groups = arrivals_expected(
        env.clock(), job_groups, window_s=3600, max_count=10, late_windows=1.0
    )
    assert [a.at_s - env.clock() for a in found.p50] == [500.0, 1500.0, 2500.0, 3500.0]
    assert found.p90 == found.p50
    assert {a.like for a in found.p50} == set(groups) == {str(latest.pk)}


def test_the_p90_replay_reads_the_streams_of_a_longer_past(one_node: Env) -> None:
    # created 2500, 1500 and 500 s ago: within the window of 1000 s only the last (no
    # stream, no arrival at the p50); within 3 windows all three, one every 1000 s, the
    # next 500 s from now, then 1500 and 2500 (within 3000 s)
    env = one_node
    _submitted(env, 2500)
    _submitted(env, 1500)
    latest = _submitted(env, 500)
    found, groups = arrivals_expected(
        env.clock(), job_groups, window_s=1000, max_count=10, late_windows=3.0
    )
    assert found.p50 == ()
    assert [a.at_s - env.clock() for a in found.p90] == [500.0, 1500.0, 2500.0]
    assert set(groups) == {str(latest.pk)}


def test_the_refresh_expects_a_higher_priority_arrival(one_node: Env) -> None:
    # The runner (high, 8 GPUs, max 4000 s) holds the node; "waiting" (low) would start when
    # it ends. Bravo submitted a high 8-GPU job (max 2000 s) 1500 and 500 s ago: the next is
    # expected 500 s from now and then every 1000 s within the hour (500, 1500, 2500, 3500):
    # all four come before the runner ends and go first, 2000 s each: "waiting" starts at
    # 4000 + 4 x 2000 = 12000 s instead of 4000.
    env = one_node
    _submitted(env, 1500)
    _submitted(env, 500)
    runner = env.submit(resources={"gpus": 8}, max_runtime_s=4000, priority_class="high")
    waiting = env.submit(resources={"gpus": 8}, max_runtime_s=4000, priority_class="low")
    # queued now on the daemon's clock: not aged by the years between it and the wall clock
    Job.objects.filter(pk__in=[runner.pk, waiting.pk]).update(queued_at=_at(env, 0))
    daemon = env.daemon()
    daemon.estimates = EtaRefresher(replace(SETTINGS, arrivals_window_s=3600.0))
    env.run(daemon)
    started = Allocation.objects.get(job=runner).started_at
    estimate = JobQueueEstimate.objects.get(job=waiting)
    assert estimate.eta_p50 == started + timedelta(seconds=4000 + 4 * 2000)
    # the p90 replay reads 3 hours back and expects as far ahead: 500, 1500, ..., 10500, all
    # queued ahead of "waiting" before the last leaves: 4000 + 11 x 2000
    assert estimate.eta_p90 == started + timedelta(seconds=4000 + 11 * 2000)
    # the same without arrivals: when the runner ends
    daemon.estimates = EtaRefresher(SETTINGS)
    env.run(daemon, seconds=1)
    estimate.refresh_from_db()
    assert estimate.eta_p50 == started + timedelta(seconds=4000)
