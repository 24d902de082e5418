"""The start ranges corrected by the estimator's own record (scheduler/sim/calibration.py)."""

from __future__ import annotations

import pytest

from scheduler.sim.calibration import Calibration, EstimateLog, corrected, score, wait_bucket

SMALL = (("tenant-type", "a", "small"), ("type", "small"), ("all",))
LARGE = (("tenant-type", "a", "large"), ("type", "large"), ("all",))


@pytest.mark.parametrize(
    ("made_at", "predicted", "actual", "floor", "expected"),
    [
        # predicted wait 10 s, waited 15 s: 5 s late over 10 + 2 -> 5/12
        pytest.param(100.0, 110.0, 115.0, 2.0, 5 / 12, id="late"),
        # predicted wait 10 s, waited 4 s: 6 s early over 12 -> -0.5
        pytest.param(100.0, 110.0, 104.0, 2.0, -0.5, id="early"),
        # predicted to start at once, started at once: -1 is the least possible
        pytest.param(100.0, 100.0, 100.0, 2.0, 0.0, id="on-time-at-once"),
        # a predicted start in the past counts as a wait of 0: waited 3 s over 0 + 2 -> 1.5
        pytest.param(100.0, 90.0, 103.0, 2.0, 1.5, id="predicted-in-the-past"),
    ],
)
def test_score(
    made_at: float, predicted: float, actual: float, floor: float, expected: float
) -> None:
    assert score(made_at, predicted, actual, floor) == pytest.approx(expected)
    # `corrected` is its inverse: the prediction moved by its own score is the actual start
    assert corrected(made_at, predicted, expected, floor) == pytest.approx(actual)


@pytest.mark.parametrize(
    ("wait", "bucket"), [(0.0, 0), (9.9, 0), (10.0, 1), (29.9, 1), (30.0, 2), (70.0, 3)]
)
def test_wait_bucket_doubles(wait: float, bucket: int) -> None:
    # floor 10: under 10 s, 10 to 30, 30 to 70, 70 to 150 ... (log2(1 + wait / 10))
    assert wait_bucket(wait, 10.0) == bucket


def test_corrected_never_before_the_estimate() -> None:
    # a wait of 10 s moved by -2 (twice its scale early): clipped at the estimate's time
    assert corrected(100.0, 110.0, -2.0, 2.0) == 100.0


def _calibration(pairs: list[tuple[float, float]], groups: tuple = SMALL) -> Calibration:
    """Pairs (predicted wait, actual wait) of estimates made at 0, p50 = p90."""
    calibration = Calibration(floor_s=10.0, min_pairs=5)
    for predicted, actual in pairs:
        calibration.observe(groups, 0.0, predicted, predicted, actual)
    return calibration


def test_a_group_always_late_by_half_is_moved_later() -> None:
    # Five estimates of small jobs predicted a 90 s wait and waited 140, 145, 150, 155, 160 s:
    # scores (140 - 90) / (90 + 10) = 0.5 .. 0.7, median 0.6, p90 at rank 3.6 -> 0.68.
    # A new estimate at t=1000 of an 80 s wait (the same scale: 7-15 floors):
    # p50 1000 + 80 + 0.6 * 90 = 1134, p90 (its replay's 100 s) 1000 + 100 + 0.68 * 110.
    calibration = _calibration([(90.0, a) for a in (140.0, 145.0, 150.0, 155.0, 160.0)])
    p50, p90 = calibration.adjust(SMALL, 1000.0, 1080.0, 1100.0)
    assert p50 == pytest.approx(1134.0)
    assert p90 == pytest.approx(1174.8)


def test_a_group_without_enough_pairs_is_left_as_the_replay_said() -> None:
    calibration = _calibration([(90.0, 150.0)] * 4)  # 4 pairs, 5 needed
    assert calibration.adjust(SMALL, 0.0, 40.0, 60.0) == (40.0, 60.0)


def test_the_narrowest_group_with_enough_pairs_speaks() -> None:
    # small jobs of team a start late (score 1: twice the wait plus 10 s), large ones on
    # time; a large job is not moved by the small ones' record, though both share ("all",)
    calibration = _calibration([(90.0, 190.0)] * 5)
    for _ in range(5):
        calibration.observe(LARGE, 0.0, 90.0, 90.0, 90.0)
    # (a wait of 80 s: 80 + 1 * (80 + 10) = 170)
    assert calibration.adjust(LARGE, 0.0, 80.0, 80.0) == (80.0, 80.0)
    assert calibration.adjust(SMALL, 0.0, 80.0, 80.0) == (170.0, 170.0)
    # a job of team b's small jobs has no group of its own yet: ("type", "small") speaks
    other = (("tenant-type", "b", "small"), ("type", "small"), ("all",))
    assert calibration.adjust(other, 0.0, 80.0, 80.0) == (170.0, 170.0)


def test_a_job_due_at_once_is_not_moved_by_the_record_of_long_waits() -> None:
    # The record holds 90 s waits that came late; a job the replay starts now (a wait
    # under the 10 s floor) is of another scale: nothing in its cell, left as it is.
    calibration = _calibration([(90.0, 190.0)] * 5)
    assert calibration.adjust(SMALL, 0.0, 0.0, 5.0) == (0.0, 5.0)


def test_the_p90_is_never_before_the_p50() -> None:
    # p50 scores (90 - 40) / 50 = 1 (late), p90 scores (90 - 200) / 210 = -0.52: a new
    # (40, 150) moves its p50 to 40 + 1 * 50 = 90 and its p90 to 150 - 0.52 * 160 = 66
    # -> raised to 90
    calibration = Calibration(floor_s=10.0, min_pairs=5)
    for _ in range(5):
        calibration.observe(SMALL, 0.0, 40.0, 200.0, 90.0)
    p50, p90 = calibration.adjust(SMALL, 0.0, 40.0, 150.0)
    assert p50 == pytest.approx(90.0)
    assert p90 == p50


def test_beyond_the_horizon_stays_none() -> None:
    calibration = _calibration([(90.0, 190.0)] * 5)
    assert calibration.adjust(SMALL, 0.0, None, None) == (None, None)


def test_only_the_latest_window_of_pairs_counts() -> None:
    # a window of 5: five late pairs, then five on time push them out
    calibration = Calibration(floor_s=10.0, min_pairs=5, window=5)
    for actual in [190.0] * 5 + [90.0] * 5:
        calibration.observe(SMALL, 0.0, 90.0, 90.0, actual)
    # (all ten: median score 0.5, and 80 would move to 125)
    assert calibration.adjust(SMALL, 0.0, 80.0, 80.0) == (80.0, 80.0)


def test_the_log_turns_estimates_into_pairs_when_the_job_starts() -> None:
    log = EstimateLog(Calibration(floor_s=10.0, min_pairs=2))
    groups = {"j1": SMALL, "j2": SMALL}
    # j1 estimated twice (at 0 and 10) to start at 50, j2 once; j2 is cancelled
    log.record(0.0, {"j1": (50.0, 50.0), "j2": (20.0, 30.0)}, groups)
    log.record(10.0, {"j1": (50.0, 50.0), "j3": (None, None)}, groups)
    assert set(log.waiting) == {"j1", "j2"}  # one beyond the horizon is not kept
    log.forget(["j2"])
    # j1 started at 100: scores (100 - 50) / 60 and (90 - 40) / 50 -> 5/6 and 1, median
    # 11/12; a new wait of 45 s (the same scale) moves to 45 + 11/12 * 55
    assert log.settle({"j1": [100.0]}) == 2
    assert log.waiting == {}
    p50, _ = log.calibration.adjust(SMALL, 0.0, 45.0, 45.0)
    assert p50 == pytest.approx(45.0 + 11 / 12 * 55.0)


def test_a_start_before_an_estimate_is_no_pair() -> None:
    # a requeued job estimated at 50, whose only start read (10) predates the estimate
    log = EstimateLog(Calibration(floor_s=10.0, min_pairs=1))
    log.record(50.0, {"j": (60.0, 60.0)}, {"j": SMALL})
    assert log.settle({"j": [10.0]}) == 0
    assert log.calibration.p50 == {}


def test_a_requeued_job_is_judged_on_the_start_that_ended_each_wait() -> None:
    # estimated at 0 to start at 10, it started at 10; preempted, estimated at 50 to start
    # at 60, it started again at 60: both estimates were right (score 0). Against its first
    # start the second would have been no pair, and against its last the first one 5 late.
    log = EstimateLog(Calibration(floor_s=10.0, min_pairs=2))
    log.record(0.0, {"j": (10.0, 10.0)}, {"j": SMALL})
    log.record(50.0, {"j": (60.0, 60.0)}, {"j": SMALL})
    assert log.settle({"j": [10.0, 60.0]}) == 2
    assert log.calibration.adjust(SMALL, 100.0, 110.0, 110.0) == (110.0, 110.0)


def test_a_long_wait_keeps_estimates_from_all_of_it_in_bounded_memory() -> None:
    log = EstimateLog(Calibration(floor_s=10.0), max_per_job=4)
    for at in range(10):
        log.record(float(at), {"j": (100.0, 100.0)}, {"j": SMALL})
    kept = [e.made_at for e in log.waiting["j"]]
    # at 4 the list [0,1,2,3] thins to [1,3], then 4, 5; at 6 [1,3,4,5] -> [3,5] ...
    assert len(kept) <= 4 and kept[-1] == 9.0 and kept == sorted(kept)


def test_jobs_still_waiting_count_as_starting_now_at_the_soonest() -> None:
    # j1 was estimated at 0 to start at 10 and still waits at 100: its score is at least
    # (100 - 10) / (10 + 10) = 4.5. The settled pairs alone (j2, on time: 0) would leave a
    # new 10 s wait as it is; with j1's bound the median of (0, 4.5) is 2.25: 10 + 2.25 * 20.
    log = EstimateLog(Calibration(floor_s=10.0, min_pairs=2))
    log.record(0.0, {"j1": (10.0, 10.0), "j2": (10.0, 10.0)}, {"j1": SMALL, "j2": SMALL})
    log.settle({"j2": [10.0]})
    adjust = log.calibration.adjust
    assert adjust(SMALL, 100.0, 110.0, 110.0) == (110.0, 110.0)  # 1 pair of 2 needed
    waiting = log.waiting_scores(100.0)
    p50, p90 = adjust(SMALL, 100.0, 110.0, 110.0, waiting)
    assert p50 == pytest.approx(100.0 + 10.0 + 2.25 * 20.0)
    # p90: rank 0.9 between 0 and 4.5 -> 4.05
    assert p90 == pytest.approx(100.0 + 10.0 + 4.05 * 20.0)
    # an estimate made now says nothing yet
    log.record(100.0, {"j3": (100.0, 100.0)}, {"j3": SMALL})
    assert log.waiting_scores(100.0).p50 == waiting.p50
