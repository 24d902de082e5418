"""`bench.eta.breakdown`: the estimates' error split by wait ahead, predicted wait and class."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench import eta
from bench.eta.breakdown import breakdown, bucket


@pytest.mark.parametrize(
    ("seconds", "label"),
    [
        pytest.param(0.0, "<1s", id="now"),
        pytest.param(-2.0, "<1s", id="a-p50-in-the-past"),
        pytest.param(1.0, "1-2s", id="edge-goes-up"),
        pytest.param(4.9, "2-5s", id="short"),
        pytest.param(19.0, "5-20s", id="medium"),
        pytest.param(80.0, ">80s", id="last-edge"),
        pytest.param(1e6, ">80s", id="long"),
    ],
)
def test_bucket_labels(seconds, label):
    assert bucket(seconds) == label


def test_breakdown_worked_example():
    # a (small): at 0 p50 1.5 (predicted 1.5 s), started at 3 (wait 3): error 1.5, rel 0.5,
    #   early (signed -1.5), p90 4 covers 3;
    # b (small): at 0 p50 40, started at 30 (wait 30): error 10, rel 1/3, late (+10), p90
    #   50 does not cover 30 (before the p50);
    # c (large): at 10 p50 60 (predicted 50), started at 40 (wait 30): error 20, rel 2/3,
    #   late (+20), p90 None (no bound) but 40 < 60: not covered;
    # d (large): at 0 p50 None: left out; e: never started: left out.
    estimates = [
        eta.Estimate("a", 0.0, 1.5, 4.0),
        eta.Estimate("b", 0.0, 40.0, 50.0),
        eta.Estimate("c", 10.0, 60.0, None),
        eta.Estimate("d", 0.0, None, None),
        eta.Estimate("e", 0.0, 5.0, 9.0),
    ]
    starts = {"a": [3.0], "b": [30.0], "c": [40.0], "d": [7.0]}
    classes = {"a": "small", "b": "small", "c": "large", "d": "large", "e": "small"}
    found = breakdown(estimates, starts, classes)
    # by wait ahead: a in 2-5 s; b and c in 20-80 s (rel 1/3 and 2/3: median 0.5)
    assert list(found["by_wait_ahead"]) == ["2-5s", "20-80s"]
    assert found["by_wait_ahead"]["2-5s"] == {
        "estimates": 1,
        "share": 0.3333,
        "median_abs_error_rel": 0.5,
        "median_signed_error_s": -1.5,
        "p50_late_share": 0.0,
        "coverage": 1.0,
    }
    waits_20_80 = found["by_wait_ahead"]["20-80s"]
    assert (waits_20_80["estimates"], waits_20_80["median_abs_error_rel"]) == (2, 0.5)
    assert (waits_20_80["median_signed_error_s"], waits_20_80["p50_late_share"]) == (15.0, 1.0)
    # by predicted wait: a 1.5 s (1-2 s), b 40 s (20-80 s), c 50 s (20-80 s)
    assert {k: v["estimates"] for k, v in found["by_predicted_wait"].items()} == {
        "1-2s": 1,
        "20-80s": 2,
    }
    # by class: small = a and b (rel 0.5 and 1/3: median 0.4167, covered 1 of 2); large = c
    assert list(found["by_class"]) == ["large", "small"]
    assert found["by_class"]["small"]["median_abs_error_rel"] == 0.4167
    assert found["by_class"]["small"]["coverage"] == 0.5
    assert found["by_class"]["large"]["median_signed_error_s"] == 20.0


def test_bench_eta_breakdown_option(tmp_path: Path) -> None:
    out = tmp_path / "out.json"
    argv = ["--engine-only", "--fraction", "0.02", "--every", "1", "--json", str(out)]
    eta.main([*argv, "--breakdown"])
    result = json.loads(out.read_text())
    judged = result["estimates"] - result["estimates_beyond_horizon"]
    for part in ("by_wait_ahead", "by_predicted_wait", "by_class"):
        assert sum(v["estimates"] for v in result["breakdown"][part].values()) == judged
    assert set(result["breakdown"]["by_class"]) <= {"small", "medium", "large"}
    eta.main(argv)
    assert "breakdown" not in json.loads(out.read_text())


def test_through_the_daemon_the_split_is_by_priority_class_and_type(db: object) -> None:
    """`bench.eta --demo --breakdown` (and the trace's daemon mode): the estimates recorded
    from the daemon's table, judged on the job's admission, split as on virtual time, the
    class being the job's priority class and type (the demo's templates differ by both)."""
    from datetime import timedelta

    from bench.eta.daemon import _figures
    from scheduler.models import JobEvent
    from tests import factories as f

    job = f.JobFactory(job_type="batch")
    admitted = JobEvent.objects.create(job=job, kind="state", to_state="admitted")
    JobEvent.objects.filter(pk=admitted.pk).update(at=job.created_at + timedelta(seconds=30))
    made = job.created_at.timestamp()
    # p50 20 s ahead, p90 40 s: the start at 30 s is 10 s after the p50, inside the range
    estimates = [eta.Estimate(str(job.pk), made, made + 20, made + 40)]
    counts = {"jobs": 1, "wall_s": 1.0, "cycles": 1, "refreshes": [], "refreshes_seen": 0}
    out = _figures(estimates, [], unrecorded=0, split=True, **counts)
    part = out["breakdown"]["by_class"][f"{job.priority_class.name}/batch"]
    assert part["estimates"] == 1 and part["coverage"] == 1.0
    assert part["median_signed_error_s"] == pytest.approx(-10.0, abs=1e-3)
    assert out["breakdown"]["by_wait_ahead"]["20-80s"]["estimates"] == 1
    assert "breakdown" not in _figures(estimates, [], unrecorded=0, **counts)
