"""Expected arrivals (scheduler.sim.arrivals) and the start estimates that replay them."""

from __future__ import annotations

import pytest

from scheduler.sim import estimate_starts, estimate_starts_within
from scheduler.sim.arrivals import arrival_streams, expected_arrivals, expected_ranges
from scheduler.sim.runtimes import Finished, RuntimeModel, estimate_queue
from tests.scheduler.core.builders import BEST_FIT, make_job, make_node, make_running, snapshot


def at(*times: float, job: str = "a", **kwargs: object) -> list:
    return [make_job(f"{job}-{i}", submitted_at=t, **kwargs) for i, t in enumerate(times)]


@pytest.mark.parametrize(
    ("submitted", "now", "expected"),
    [
        # gap (30 - 0) / 3 = 10 from the last at 30: 40, 50, 60 within 35 + 25
        pytest.param(at(0, 10, 20, 30), 35.0, [40.0, 50.0, 60.0], id="periodic"),
        # at 41 the one expected at 40 is past: 50 and 60 remain within 41 + 25
        pytest.param(at(0, 10, 20, 30), 41.0, [50.0, 60.0], id="the-next-after-now"),
        # 35 - 10 = 25 > 2 gaps of 10: the stream is over
        pytest.param(at(0, 10), 35.0, [], id="stale"),
        # one submission in the window is no stream
        pytest.param(at(30), 35.0, [], id="single"),
        # 3 at one instant in a window of 60: one every 20 from 30
        pytest.param(at(30, 30, 30), 35.0, [50.0], id="burst"),
        # -100 and -90 are out of the window (-25, 35]: only 10, 20, 30 count
        pytest.param(at(-100, -90, 10, 20, 30), 35.0, [40.0, 50.0, 60.0], id="window"),
        # submitted after now: not known yet
        pytest.param(at(10, 20, 30, 40), 35.0, [40.0, 50.0, 60.0], id="future-ignored"),
    ],
)
def test_arrivals_continue_a_live_stream(submitted, now, expected):
    streams = arrival_streams(submitted, now, window_s=60.0)
    found = expected_arrivals(streams, now, lookahead_s=25.0, max_count=10)
    assert [a.at_s for a in found] == expected


def test_streams_split_by_tenant_class_and_shape():
    # each shape has its own pace: a/normal every 10, a/high every 5, a/normal on 2 GPUs
    # every 20, b/normal every 10
    submitted = [
        *at(0, 10, 20, job="a-normal"),
        *at(10, 15, 20, job="a-high", priority="high"),
        *at(0, 20, job="a-two", gpus=2),
        *at(0, 10, 20, job="b-normal", tenant="team-b"),
    ]
    streams = arrival_streams(submitted, 20.0, window_s=60.0)
    gaps = {s.template.id: s.gap_s for s in streams}
    assert gaps == {"a-normal-2": 10.0, "a-high-2": 5.0, "a-two-1": 20.0, "b-normal-2": 10.0}


def test_the_first_arrivals_in_time_order_are_kept():
    # a every 10 from 20 (30, 40, ...), b every 4 from 20 (24, 28, 32, ...): the first 4
    submitted = [*at(10, 20, job="a"), *at(16, 20, job="b", tenant="team-b")]
    streams = arrival_streams(submitted, 20.0, window_s=60.0)
    found = expected_arrivals(streams, 20.0, lookahead_s=100.0, max_count=4)
    assert [(a.at_s, a.like) for a in found] == [
        (24.0, "b-1"),
        (28.0, "b-1"),
        (30.0, "a-1"),
        (32.0, "b-1"),
    ]
    assert len({a.job.id for a in found}) == 4
    assert all(a.job.submitted_at == a.at_s for a in found)


def _one_node_busy_until_200():
    """n1 is held until 200 by r (high, 200 s from 0); "low" (8 GPUs, low priority) waits
    at 100. A stream of 8-GPU high jobs of 300 s, one every 1000 s, the last at -850: the
    next is expected at 150."""
    running = [make_running(make_job("r", gpus=8, runtime=200, priority="high"), ("n1", range(8)))]
    low = make_job("low", gpus=8, runtime=50, priority="low", submitted_at=90)
    snap = snapshot([make_node("n1")], [low], running, now=100.0)
    past = at(-1850, -850, job="hi", gpus=8, runtime=300, priority="high")
    streams = arrival_streams(past, 100.0, window_s=3600.0)
    return snap, expected_arrivals(streams, 100.0, lookahead_s=3600.0, max_count=10)


def test_a_higher_priority_arrival_delays_the_estimate_by_its_runtime():
    # without arrivals "low" starts when r ends (200); the high job expected at 150 waits
    # for r too and goes first at 200: "low" starts at 200 + 300 = 500
    snap, arrivals = _one_node_busy_until_200()
    assert [a.at_s for a in arrivals] == [150.0, 1150.0, 2150.0, 3150.0]
    assert estimate_starts(snap, BEST_FIT) == {"low": 200.0}
    assert estimate_starts(snap, BEST_FIT, arrivals=arrivals) == {"low": 500.0}


def test_the_replay_ends_once_every_waiting_job_started():
    # the expected arrivals after "low" started (1150, 2150, ...) are never replayed to
    # their end: the replay settled, not stopped
    snap, arrivals = _one_node_busy_until_200()
    found = estimate_starts_within(snap, BEST_FIT, arrivals=arrivals)
    assert found == type(found)({"low": 500.0}, stopped=False)


def test_an_arrival_runs_as_long_as_the_history_of_the_job_it_is_like():
    # "hi-1"'s group ran half its max: the expected arrival runs 150 s, not 300;
    # "low" starts at 200 + 150 = 350 at its p50; the p90 ratio of (.5, .5, .5, .5, 1) is
    # .5 + .6 * .5 = .8: 200 + 240 = 440 at its p90
    snap, arrivals = _one_node_busy_until_200()
    history = [Finished(("hi",), 150.0, 300.0)] * 4 + [Finished(("hi",), 300.0, 300.0)]
    model = RuntimeModel(history)
    found = estimate_queue(snap, BEST_FIT, model, {"hi-1": ("hi",)}, max_jobs=10, arrivals=arrivals)
    assert found.ranges == {"low": (350.0, 440.0)}


def test_the_range_may_span_the_present_alone_to_the_expected_arrivals():
    # without arrivals in the p50 replay: the p50 start is when r ends (200), the p90 start
    # after the high job expected at 150 (200 + 300 = 500); no history: p50 = p90 runtimes,
    # yet the two replays differ and both run
    snap, arrivals = _one_node_busy_until_200()
    found = estimate_queue(
        snap, BEST_FIT, RuntimeModel([]), {}, max_jobs=10, arrivals=arrivals, arrivals_in_p50=False
    )
    assert found.ranges == {"low": (200.0, 500.0)}


def test_the_p90_replay_expects_the_arrivals_of_a_longer_window():
    # a every 10 from 0 to 30, b at -30 and 0; now 35, window 25, 3 windows for the p90:
    # p50: (10, 35] holds a's 20 and 30 (gap 10: 40, 50, 60 within 35 + 25) and one of b's
    # (no stream); p90: (-40, 35] holds a's four (40, ..., 110 within 35 + 75) and b's two
    # (gap 30 from 0: 60, 90)
    submitted = [*at(0, 10, 20, 30, job="a"), *at(-30, 0, job="b", tenant="team-b")]
    found = expected_ranges(submitted, 35.0, window_s=25.0, max_count=20, late_windows=3.0)
    assert [(x.at_s, x.like) for x in found.p50] == [(40.0, "a-3"), (50.0, "a-3"), (60.0, "a-3")]
    assert [(x.at_s, x.like) for x in found.p90] == [
        (40.0, "a-3"),
        (50.0, "a-3"),
        (60.0, "a-3"),
        (60.0, "b-1"),
        (70.0, "a-3"),
        (80.0, "a-3"),
        (90.0, "a-3"),
        (90.0, "b-1"),
        (100.0, "a-3"),
        (110.0, "a-3"),
    ]
    assert found.templates == {"a-3", "b-1"}


@pytest.mark.parametrize("late_windows", [1.0, 0.5], ids=["one", "under-one"])
def test_one_window_gives_both_replays_the_same_arrivals(late_windows):
    found = expected_ranges(
        at(0, 10, 20, 30), 35.0, window_s=25.0, max_count=20, late_windows=late_windows
    )
    assert [x.at_s for x in found.p50] == [40.0, 50.0, 60.0]
    assert found.p90 == found.p50


def test_arrivals_of_the_p90_replay_alone_move_the_p90_start():
    # the high job expected at 150 in the p90 replay only: "low" starts when r ends (200)
    # at its p50, after the high job (200 + 300 = 500) at its p90
    snap, arrivals = _one_node_busy_until_200()
    found = estimate_queue(
        snap, BEST_FIT, RuntimeModel([]), {}, max_jobs=10, arrivals=(), arrivals_p90=arrivals
    )
    assert found.ranges == {"low": (200.0, 500.0)}
