"""Runtimes from the history of similar jobs, and start ranges replayed on them."""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import given
from hypothesis import strategies as st

from scheduler.sim.runtimes import (
    Finished,
    Running,
    RuntimeModel,
    estimate_start_ranges,
    groups_of,
    quantile,
)
from tests.scheduler.core.builders import BEST_FIT, make_job, make_node, make_running, snapshot

NARROW = groups_of("proj", "team-a", "training", 8000)
SAME_TYPE_OTHER_SIZE = groups_of("proj", "team-a", "training", 1000)
OTHER_PROJECT = groups_of("other", "team-b", "training", 8000)
OTHER_TYPE = groups_of("other", "team-b", "inference", 500)
ALICE = groups_of("proj", "team-a", "training", 8000, user="alice")
BOB = groups_of("proj", "team-a", "training", 8000, user="bob")
# actual / max: median 0.4; p90 at rank 0.9 * 4 = 3.6: 0.4 + (0.9 - 0.4) * 0.6 = 0.7
RATIOS = [0.1, 0.4, 0.4, 0.4, 0.9]


def ran(groups, ratios, max_s=1000.0):
    """Finished jobs of ``groups`` that ran ``ratios`` of ``max_s``."""
    return [Finished(groups, r * max_s, max_s) for r in ratios]


def test_quantile_interpolates_between_ranks():
    assert quantile(RATIOS, 0.5) == 0.4
    assert quantile(RATIOS, 0.9) == pytest.approx(0.7)


@pytest.mark.parametrize(
    ("samples", "groups", "max_s", "estimate", "expected"),
    [
        # the same project, type and size: max 1000 s -> 400 s (p50), 700 s (p90)
        pytest.param(ran(NARROW, RATIOS), NARROW, 1000, None, (400, 700), id="narrow"),
        # ratios travel between maxima: history at max 100 s, the job declares 1000 s
        pytest.param(ran(NARROW, RATIOS, 100), NARROW, 1000, None, (400, 700), id="ratio"),
        # only another size of the same project and type: the wider group speaks
        pytest.param(ran(SAME_TYPE_OTHER_SIZE, RATIOS), NARROW, 1000, None, (400, 700), id="wider"),
        # 4 narrow samples (too few) at 0.9, 5 of another size at RATIOS: project-type has
        # all 9: sorted 0.1 0.4 0.4 0.4 0.9 0.9 0.9 0.9 0.9 -> median 0.9, p90 0.9
        pytest.param(
            ran(NARROW, [0.9] * 4) + ran(SAME_TYPE_OTHER_SIZE, RATIOS),
            NARROW,
            1000,
            None,
            (900, 900),
            id="too-few-narrow",
        ),
        # other projects of the type only: the type's own group
        pytest.param(ran(OTHER_PROJECT, RATIOS), NARROW, 1000, None, (400, 700), id="type"),
        # only other types: every finished job (the widest group) rather than the max
        pytest.param(ran(OTHER_TYPE, RATIOS), NARROW, 1000, None, (400, 700), id="all-jobs"),
        # the user's own runs outweigh the project's: alice's at 0.1, bob's at 0.9
        pytest.param(
            ran(ALICE, [0.1] * 5) + ran(BOB, [0.9] * 5), ALICE, 1000, None, (100, 100), id="user"
        ),
        # a new user of the project: the project's runs, alice's and bob's together
        # (0.1 x5, 0.9 x5: median 0.5, p90 at rank 8.1 = 0.9)
        pytest.param(
            ran(ALICE, [0.1] * 5) + ran(BOB, [0.9] * 5),
            groups_of("proj", "team-a", "training", 8000, user="carol"),
            1000,
            None,
            (500, 900),
            id="new-user",
        ),
        # no history: the max; a submitter's estimate for the p50
        pytest.param([], NARROW, 1000, None, (1000, 1000), id="no-history"),
        pytest.param([], NARROW, 1000, 250, (250, 1000), id="estimate"),
        # no max: the group's runtimes in seconds (of jobs with or without a max)
        pytest.param(ran(NARROW, RATIOS), NARROW, None, None, (400, 700), id="unbounded"),
        pytest.param(
            [Finished(NARROW, s) for s in (100, 400, 400, 400, 900)],
            NARROW,
            None,
            None,
            (400, 700),
            id="unbounded-history",
        ),
        # no max and no history: the documented horizon (unbounded_runtime_s = 5000 here)
        pytest.param([], NARROW, None, None, (5000, 5000), id="unbounded-no-history"),
        pytest.param([], NARROW, None, 600, (600, 5000), id="unbounded-estimate"),
        # a run over its max (stopped a little late) counts as the max
        pytest.param(ran(NARROW, [1.5] * 5), NARROW, 1000, None, (1000, 1000), id="clipped"),
    ],
)
def test_history_corrects_the_max(samples, groups, max_s, estimate, expected):
    model = RuntimeModel(samples, unbounded_runtime_s=5000)
    job = make_job("j", runtime=max_s)
    if estimate is not None:
        job = replace(job, estimated_runtime_s=estimate)
    runtime = model.runtime(job, groups)
    assert (runtime.p50_s, runtime.p90_s) == pytest.approx(expected)


@pytest.mark.parametrize(
    ("elapsed", "max_s", "expected"),
    [
        # not started: the whole group (0.1 0.4 0.4 0.4 0.9)
        pytest.param(0, 1000, (400, 700), id="waiting"),
        # ran 300 s: only the runs that lasted that long (0.4 0.4 0.4 0.9): median 0.4,
        # p90 at rank 2.7: 0.4 + 0.5 * 0.7 = 0.75
        pytest.param(300, 1000, (400, 750), id="past-the-short-runs"),
        # ran 500 s: only 0.9 is left
        pytest.param(500, 1000, (900, 900), id="a-long-one"),
        # ran past every run seen: ends now at the p50, at its max at the p90
        pytest.param(950, 1000, (950, 1000), id="past-them-all"),
        pytest.param(1200, 1000, (1000, 1000), id="past-its-max"),
        # no max: the same in seconds, the longest run seen the p90 past them all
        pytest.param(300, None, (400, 750), id="unbounded"),
        pytest.param(950, None, (950, 950), id="unbounded-past-them-all"),
    ],
)
def test_a_running_job_is_judged_on_the_runs_that_lasted_as_long(elapsed, max_s, expected):
    model = RuntimeModel(ran(NARROW, RATIOS))
    runtime = model.runtime(make_job("j", runtime=max_s), NARROW, elapsed_s=elapsed)
    assert (runtime.p50_s, runtime.p90_s) == pytest.approx(expected)


finished = st.builds(
    Finished,
    st.sampled_from([NARROW, SAME_TYPE_OTHER_SIZE, OTHER_PROJECT, OTHER_TYPE, ALICE, BOB]),
    st.floats(0, 1e6),
    st.one_of(st.none(), st.floats(1, 1e5)),
)


@given(
    samples=st.lists(finished, max_size=40),
    groups=st.sampled_from([NARROW, OTHER_TYPE, ALICE, groups_of("x", "y", "z", 1)]),
    max_s=st.one_of(st.none(), st.floats(1, 1e5)),
    estimate=st.one_of(st.none(), st.floats(1, 1e6)),
    elapsed=st.floats(0, 2e5),
)
def test_p50_within_p90_within_the_max(samples, groups, max_s, estimate, elapsed):
    job = replace(make_job("j", runtime=max_s), estimated_runtime_s=estimate)
    runtime = RuntimeModel(samples, min_samples=3).runtime(job, groups, elapsed_s=elapsed)
    assert 0 <= runtime.p50_s <= runtime.p90_s
    if max_s is not None:
        assert runtime.p90_s <= max_s * (1 + 1e-9)


def test_jobs_still_running_count_as_lower_bounds_of_their_groups_runtimes():
    """Five short runs have ended (0.1-0.25 of the max) while ten jobs of the group have run
    0.6 of it and go on: from the ended alone a waiting job would run 0.2 of its max; with
    the running ones as lower bounds (Kaplan-Meier) at least 0.6."""
    short = ran(NARROW, [0.1, 0.15, 0.2, 0.2, 0.25])
    job = make_job("j", runtime=1000)
    alone = RuntimeModel(short).runtime(job, NARROW)
    assert (alone.p50_s, alone.p90_s) == pytest.approx((200, 230))
    lasting = [Running(NARROW, 600.0, 1000.0) for _ in range(10)]
    runtime = RuntimeModel(short).with_running(lasting).runtime(job, NARROW)
    assert (runtime.p50_s, runtime.p90_s) == pytest.approx((600, 600))


def test_a_running_jobs_share_goes_to_the_longer_runs_only():
    """Kaplan-Meier, not a finished-only median: a job running 0.2 of its max among ends at
    0.1, 0.3, 0.5, 0.7, 0.9 gives its share to the four longer runs (each 3/14, the first
    1/7), so the median is past 0.5."""
    model = RuntimeModel(ran(NARROW, [0.1, 0.3, 0.5, 0.7, 0.9]))
    job = make_job("j", runtime=1000)
    assert model.runtime(job, NARROW).p50_s == pytest.approx(500)
    censored = model.with_running([Running(NARROW, 200.0, 1000.0)]).runtime(job, NARROW)
    assert censored.p50_s > 500
    assert censored.p50_s < 700


running = st.builds(
    Running,
    st.sampled_from([NARROW, SAME_TYPE_OTHER_SIZE, ALICE]),
    st.floats(0, 1e5),
    st.one_of(st.none(), st.floats(1, 1e5)),
)


@given(
    samples=st.lists(finished, max_size=30),
    lasting=st.lists(running, max_size=30),
    groups=st.sampled_from([NARROW, ALICE]),
    max_s=st.one_of(st.none(), st.floats(1, 1e5)),
    elapsed=st.floats(0, 2e5),
)
def test_running_jobs_keep_p50_within_p90_within_the_max(samples, lasting, groups, max_s, elapsed):
    model = RuntimeModel(samples, min_samples=3).with_running(lasting)
    runtime = model.runtime(make_job("j", runtime=max_s), groups, elapsed_s=elapsed)
    assert 0 <= runtime.p50_s <= runtime.p90_s
    if max_s is not None:
        assert runtime.p90_s <= max_s * (1 + 1e-9)


@given(
    ended=st.lists(st.floats(0, 1), min_size=5, max_size=30),
    lasting=st.lists(st.floats(0, 1), max_size=30),
)
def test_lower_bounds_never_shorten_the_median_runtime(ended, lasting):
    """A running job's share moves only to runs longer than it, so the runs that are still
    going never make a group's median runtime shorter than its ended runs' alone."""
    model = RuntimeModel(ran(NARROW, ended))
    job = make_job("j", runtime=1000)
    alone = model.runtime(job, NARROW)
    censored = model.with_running(Running(NARROW, v * 1000, 1000.0) for v in lasting)
    assert censored.runtime(job, NARROW).p50_s >= alone.p50_s - 1e-6


def _waiting_behind_one_runner():
    # r (8 GPUs, max 1000 s) started at 0 on the only node; a (8 GPUs) waits for it.
    running = [make_running(make_job("r", gpus=8, runtime=1000), ("n1", range(8)))]
    pending = [make_job("a", gpus=8, runtime=1000, submitted_at=0)]
    return snapshot([make_node("n1")], pending, running, now=100.0)


def test_start_range_from_history():
    # r's group ended at 0.4 (median) and 0.7 (p90) of its max; r itself, 100 s into its
    # run, is a lower bound at 0.1: its share goes to the longer runs (each 5/24, the end at
    # 0.1 1/6), so the p90 moves to 0.705. a starts at 400 .. 705.
    model = RuntimeModel(ran(NARROW, RATIOS))
    ranges = estimate_start_ranges(
        _waiting_behind_one_runner(), BEST_FIT, model, {"r": NARROW, "a": NARROW}
    )
    assert ranges.ranges() == {"a": (pytest.approx(400.0), pytest.approx(705.0))}
    assert not ranges.p50.stopped


def test_without_history_the_start_is_the_max():
    ranges = estimate_start_ranges(_waiting_behind_one_runner(), BEST_FIT, RuntimeModel([]), {})
    assert ranges.ranges() == {"a": (1000.0, 1000.0)}


def test_a_stopped_replay_settles_nothing_it_did_not_reach():
    ranges = estimate_start_ranges(
        _waiting_behind_one_runner(), BEST_FIT, RuntimeModel([]), {}, stop=lambda: True
    )
    assert ranges.p50.stopped and ranges.p90.stopped
    assert ranges.ranges() == {}


def test_equal_p50_and_p90_runtimes_are_replayed_once(monkeypatch):
    """Without history every job's p50 and p90 runtimes are its max: the two replays would
    be the same, so one runs and gives both. With history, two run."""
    from scheduler.sim import runtimes

    replays: list[dict[str, float]] = []
    replay = runtimes.estimate_starts_within

    def counted(*args, **kwargs):
        replays.append(kwargs["runtimes"])
        return replay(*args, **kwargs)

    monkeypatch.setattr(runtimes, "estimate_starts_within", counted)
    once = estimate_start_ranges(_waiting_behind_one_runner(), BEST_FIT, RuntimeModel([]), {})
    assert len(replays) == 1 and once.p90 is once.p50
    assert once.ranges() == {"a": (1000.0, 1000.0)}
    model = RuntimeModel(ran(NARROW, RATIOS))
    estimate_start_ranges(_waiting_behind_one_runner(), BEST_FIT, model, {"r": NARROW})
    assert len(replays) == 3
