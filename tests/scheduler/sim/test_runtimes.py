"""Runtimes from the history of similar jobs, and start ranges replayed on them."""

from __future__ import annotations

from dataclasses import replace

import pytest

from scheduler.sim.runtimes import (
    RuntimeModel,
    estimate_start_ranges,
    groups_of,
    quantile,
)
from tests.scheduler.core.builders import BEST_FIT, make_job, make_node, make_running, snapshot

NARROW = groups_of("proj", "team-a", "training", 8000)
SAME_TYPE_OTHER_SIZE = groups_of("proj", "team-a", "training", 1000)
OTHER_PROJECT = groups_of("other", "team-b", "training", 8000)
# actual / max: median 0.4; p90 at rank 0.9 * 4 = 3.6: 0.4 + (0.9 - 0.4) * 0.6 = 0.7
RATIOS = [0.1, 0.4, 0.4, 0.4, 0.9]


def test_quantile_interpolates_between_ranks():
    assert quantile(RATIOS, 0.5) == 0.4
    assert quantile(RATIOS, 0.9) == pytest.approx(0.7)


@pytest.mark.parametrize(
    ("samples", "groups", "max_s", "estimate", "expected"),
    [
        # the same project, type and size: max 1000 s -> 400 s (p50), 700 s (p90)
        pytest.param([(NARROW, r) for r in RATIOS], NARROW, 1000, None, (400, 700), id="narrow"),
        # only another size of the same project and type: the wider group speaks
        pytest.param(
            [(SAME_TYPE_OTHER_SIZE, r) for r in RATIOS], NARROW, 1000, None, (400, 700), id="wider"
        ),
        # 4 narrow samples (too few) at 0.9, 5 of another size at RATIOS: project-type has
        # all 9: sorted 0.1 0.4 0.4 0.4 0.9 0.9 0.9 0.9 0.9 -> median 0.9, p90 0.9
        pytest.param(
            [(NARROW, 0.9)] * 4 + [(SAME_TYPE_OTHER_SIZE, r) for r in RATIOS],
            NARROW,
            1000,
            None,
            (900, 900),
            id="too-few-narrow",
        ),
        # other projects of the type only: the type's own group (the widest)
        pytest.param(
            [(OTHER_PROJECT, r) for r in RATIOS], NARROW, 1000, None, (400, 700), id="type"
        ),
        # no history: the max; a submitter's estimate for the p50
        pytest.param([], NARROW, 1000, None, (1000, 1000), id="no-history"),
        pytest.param([], NARROW, 1000, 250, (250, 1000), id="estimate"),
        # no max: the documented horizon (unbounded_runtime_s = 5000 here)
        pytest.param(
            [(NARROW, r) for r in RATIOS], NARROW, None, None, (5000, 5000), id="unbounded"
        ),
        # a run over its max (stopped a little late) counts as the max
        pytest.param([(NARROW, 1.5)] * 5, NARROW, 1000, None, (1000, 1000), id="clipped"),
    ],
)
def test_history_corrects_the_max(samples, groups, max_s, estimate, expected):
    model = RuntimeModel(samples, unbounded_runtime_s=5000)
    job = make_job("j", runtime=max_s)
    if estimate is not None:
        job = replace(job, estimated_runtime_s=estimate)
    runtime = model.runtime(job, groups)
    assert (runtime.p50_s, runtime.p90_s) == pytest.approx(expected)


def _waiting_behind_one_runner():
    # r (8 GPUs, max 1000 s) started at 0 on the only node; a (8 GPUs) waits for it.
    running = [make_running(make_job("r", gpus=8, runtime=1000), ("n1", range(8)))]
    pending = [make_job("a", gpus=8, runtime=1000, submitted_at=0)]
    return snapshot([make_node("n1")], pending, running, now=100.0)


def test_start_range_from_history():
    # r's group ended at 0.4 (median) and 0.7 (p90) of its max: a starts at 400 .. 700.
    model = RuntimeModel([(NARROW, r) for r in RATIOS])
    ranges = estimate_start_ranges(
        _waiting_behind_one_runner(), BEST_FIT, model, {"r": NARROW, "a": NARROW}
    )
    assert ranges.ranges() == {"a": (pytest.approx(400.0), pytest.approx(700.0))}
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
    model = RuntimeModel([(NARROW, r) for r in RATIOS])
    estimate_start_ranges(_waiting_behind_one_runner(), BEST_FIT, model, {"r": NARROW})
    assert len(replays) == 3
