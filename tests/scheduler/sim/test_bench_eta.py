"""`python -m bench.eta` on a tiny trace: it runs, records estimates and scores them."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import pytest

from bench import eta
from scheduler.sim.runtimes import quantile
from tests import factories as f


def test_bench_eta_smoke(tmp_path: Path) -> None:
    out = tmp_path / "out.json"
    eta.main(["--engine-only", "--fraction", "0.02", "--every", "1", "--json", str(out)])
    result = json.loads(out.read_text())
    assert result["estimates"] > 0
    assert result["median_abs_error_s"] is not None and result["median_abs_error_s"] >= 0
    assert result["p90_abs_error_s"] >= result["median_abs_error_s"]
    assert 0 <= result["coverage"] <= 1
    # the naive estimator's figures beside, at the same moments
    baseline = result["baseline"]
    assert baseline["estimates"] == result["estimates"]
    assert {"median_abs_error_rel", "within_60s_share", "coverage"} <= set(baseline)
    assert 0 <= result["within_60s_share"] <= 1 and result["median_abs_error_rel"] >= 0


def test_relative_error_and_short_waits_worked_example() -> None:
    # a: estimated at 0 to start at 100, started at 150: error 50 over a wait of 150 (1/3);
    # b: estimated at 0 to start at 900, started at 700: error 200 over 700 (2/7), a short
    # wait (under 600 s? no: 700) so not counted in within_60s;
    # c: estimated at 10 to start at 10.5, started at 10.2: error 0.3 over a wait of 0.2,
    # counted as 1 s: 0.3. Relative errors 0.3, 2/7 = 0.2857, 1/3: median 0.3.
    # Short waits: a (150 s, error 50 <= 60: right) and c (right): 2 of 2.
    estimates = [
        eta.Estimate("a", 0.0, 100.0, 200.0),
        eta.Estimate("b", 0.0, 900.0, 950.0),
        eta.Estimate("c", 10.0, 10.5, 11.0),
    ]
    starts = {"a": [150.0], "b": [700.0], "c": [10.2]}
    scored = eta.score(estimates, starts)
    assert scored["median_abs_error_rel"] == 0.3
    assert scored["within_60s_share"] == 1.0
    # against a naive estimator that put a at 300 (error 150 > 60): 1 of 2 short waits
    naive = [eta.Estimate("a", 0.0, 300.0, 300.0), *estimates[1:]]
    both = eta.scored(estimates, naive, starts)
    assert both["within_60s_share"] == 1.0 and both["baseline"]["within_60s_share"] == 0.5


def test_score_worked_example() -> None:
    # a: started at 10, estimated 8..12 (inside, error 2) and 11..11 (outside, error 1);
    # b: started at 5, estimated 9..20 (outside, error 4). Errors 1, 2, 4: median 2,
    # p90 at rank 1.8: 2 + (4 - 2) * 0.8 = 3.6; coverage 1 of 3.
    estimates = [
        eta.Estimate("a", 0.0, 8.0, 12.0),
        eta.Estimate("a", 1.0, 11.0, 11.0),
        eta.Estimate("b", 0.0, 9.0, 20.0),
        eta.Estimate("never", 0.0, 1.0, 2.0),  # never started: not judged
    ]
    scored = eta.score(estimates, {"a": [10.0], "b": [5.0], "never": []})
    assert scored["estimates"] == 3
    assert scored["median_abs_error_s"] == 2.0
    assert scored["p90_abs_error_s"] == quantile([1.0, 2.0, 4.0], 0.9) == 3.6
    assert scored["coverage"] == round(1 / 3, 4)
    # both misses started before their p50; none after its p90
    assert (scored["early"], scored["late"]) == (round(2 / 3, 4), 0.0)


def test_a_requeued_job_is_judged_on_the_start_that_ended_each_wait() -> None:
    # r started at 10, was preempted, and started again at 60. Estimated at 0 to start at
    # 10 and at 50 to start at 62: errors 0 and 2 (over a wait of 10: 0.2). Against its
    # first start the second estimate would be error 52 over a wait counted as 1 s.
    estimates = [eta.Estimate("r", 0.0, 10.0, 12.0), eta.Estimate("r", 50.0, 62.0, 64.0)]
    scored = eta.score(estimates, {"r": [10.0, 60.0]})
    assert scored["estimates"] == 2
    assert scored["median_abs_error_s"] == 1.0  # errors 0 and 2
    assert scored["median_abs_error_rel"] == 0.1  # 0 / 10 and 2 / 10
    # an estimate made after the job's last start (a stale read) is not judged
    late = [*estimates, eta.Estimate("r", 70.0, 80.0, 90.0)]
    assert eta.score(late, {"r": [10.0, 60.0]})["estimates"] == 2
    assert eta.next_start([10.0, 60.0], 10.0) == 10.0  # started in the cycle that estimated


def test_the_error_over_the_whole_wait_and_each_waits_first_estimate() -> None:
    # a waited from its first estimate (0) to 10: estimated at 0 for 8 (error 2, inside
    # 8..12) and at 8 for 11 (error 1, outside). Over the wait ahead: 2 / 10 and 1 / 2,
    # median 0.35; over the whole wait (10): 0.2 and 0.1, median 0.15. r's second wait
    # began at its estimate of 50 and ended at 60 (error 2 over 10); its first at 0.
    estimates = [
        eta.Estimate("a", 0.0, 8.0, 12.0),
        eta.Estimate("a", 8.0, 11.0, 11.0),
        eta.Estimate("r", 0.0, 10.0, 12.0),
        eta.Estimate("r", 50.0, 62.0, 64.0),
    ]
    scored = eta.score(estimates, {"a": [10.0], "r": [10.0, 60.0]})
    ahead = eta.score(estimates[:2], {"a": [10.0]})
    assert ahead["median_abs_error_rel"] == 0.35
    assert ahead["median_abs_error_rel_of_wait"] == pytest.approx(0.15)
    # each wait's first estimate: a's at 0 (0.2, inside), r's at 0 (0, inside) and at 50
    # (0.2, outside: 60 is before its p50 of 62)
    assert scored["first_estimates"] == {
        "waits": 3,
        "median_abs_error_rel": 0.2,
        "coverage": round(2 / 3, 4),
    }
    assert eta.waits_began([(e, 10.0 if e.at < 50 else 60.0) for e in estimates]) == {
        ("a", 10.0): 0.0,
        ("r", 10.0): 0.0,
        ("r", 60.0): 50.0,
    }


DAEMON_KEYS = {
    "estimates",
    "median_abs_error_s",
    "p90_abs_error_s",
    "coverage",
    "jobs_started",
    "jobs_estimated",
    "started_never_estimated",
    "estimated_unrecorded",
    "refreshes",
    "trace",
    "host",
    "median_abs_error_rel",
    "within_60s_share",
    "baseline",
}


def test_bench_eta_through_the_daemon_records_every_estimate(
    transactional_db: Any, tmp_path: Path
) -> None:
    # The daemon, the submitter and the recorder are processes of their own on one database:
    # a transactional one, so that they see each other's rows.
    # A generous budget: on a loaded host (the suite's two workers) a refresh cut off at 1 s
    # records nothing, and the figures would be empty. Stretched 4 times, so that jobs wait
    # long enough to be estimated while a loaded host slows the refreshes (at 2, a load
    # average of 8 left some runs without one estimate).
    out = tmp_path / "out.json"
    eta.main(
        ["--fraction", "0.02", "--stretch", "4", "--every", "0.5", "--history-every", "1",
         "--poll", "0.05", "--interval", "0.5", "--budget", "10", "--database-url", "",
         "--json", str(out)]
    )  # fmt: skip
    result = json.loads(out.read_text())
    assert set(result) >= DAEMON_KEYS
    assert result["trace"]["driven_by"].startswith("scheduler daemon")
    assert result["jobs"] == result["jobs_started"] == 60
    # every estimate the daemon made (as it read its table after each refresh) was recorded,
    # so every started job it estimated while it waited has its estimates in the figures
    assert result["estimated_unrecorded"] == 0
    assert result["estimates"] > 0 and result["jobs_estimated"] > 0
    assert result["jobs_estimated"] + result["started_never_estimated"] == result["jobs_started"]
    assert 0 <= result["coverage"] <= 1


def _shares(runtimes: str) -> dict[tuple[str, str], list[float]]:
    """Each (team, class)'s runtimes as shares of their max, in the trace of `runtimes`."""
    out: dict[tuple[str, str], list[float]] = {}
    for job in eta.workload(1, 0.2, seed=3, runtimes=runtimes):
        request = job.request
        assert request.max_runtime_s is not None
        share = job.duration_s / request.max_runtime_s
        assert 0 < share <= 1
        out.setdefault((request.tenant, request.priority_class), []).append(share)
    return out


def _spread(values: list[float]) -> float:
    return quantile(values, 0.9) - quantile(values, 0.1)


@pytest.mark.parametrize(("runtimes", "recurring"), [("recurring", True), ("independent", False)])
def test_recurring_runtimes_differ_between_groups_more_than_within(
    runtimes: str, recurring: bool
) -> None:
    # "recurring": each (team, class) has its typical share and its jobs stay near it, so
    # the typical spread within a group (p10..p90) is smaller than that of the groups'
    # medians; "independent": every job at random, the groups' medians close together.
    groups = _shares(runtimes)
    within = quantile([_spread(v) for v in groups.values()], 0.5)
    between = _spread([quantile(v, 0.5) for v in groups.values()])
    assert (within < between) is recurring


def test_the_independent_trace_is_the_one_measured_before() -> None:
    # The option draws nothing more for "independent": its runtimes come from the same
    # random stream as before the option existed (each job one triangular draw, in order).
    rng = random.Random(1)
    jobs = eta.workload(1, 0.2, seed=1)
    for job in jobs:
        assert job.request.max_runtime_s is not None
        assert job.duration_s == job.request.max_runtime_s * rng.triangular(0.1, 1.0, 0.3)


def test_an_oracle_of_runtimes_and_arrivals_is_exact(tmp_path: Path) -> None:
    # The replay is the engine itself: told every runtime and every arrival to come, its
    # estimates are the actual starts, so what error the learned estimator has is the
    # runtimes' and the arrivals' (bench.eta --oracle splits it so).
    out = tmp_path / "out.json"
    eta.main(["--engine-only", "--fraction", "0.05", "--every", "1", "--oracle", "all",
              "--json", str(out)])  # fmt: skip
    result = json.loads(out.read_text())
    assert result["estimates"] > 0
    assert result["median_abs_error_s"] == 0 and result["median_abs_error_rel"] == 0
    assert result["trace"]["calibrated"] is False  # an oracle is never corrected


def test_calibrated_figures_carry_the_replays_own_beside(tmp_path: Path) -> None:
    out = tmp_path / "out.json"
    eta.main(["--engine-only", "--fraction", "0.05", "--every", "1", "--runtimes", "recurring",
              "--calibrate", "--json", str(out)])  # fmt: skip
    result = json.loads(out.read_text())
    assert result["trace"]["calibrated"] is True
    assert result["uncalibrated"]["estimates"] == result["estimates"] > 0


def test_bench_eta_on_the_demo_load_through_the_daemon(
    transactional_db: Any, tmp_path: Path
) -> None:
    # The demo organisation, cluster and load generator through the daemon for a few
    # seconds (speed 30: the generator submits every 0.5 s, jobs run 1-30 s); the figures
    # come out with the recorder's, and the seeded jobs were cancelled, not measured.
    # The demo's policies name priority classes: the migration's seed, which a transactional
    # test before this one may have flushed.
    f.seed_priority_classes()
    out = tmp_path / "out.json"
    eta.main(
        ["--demo", "--minutes", "0.25", "--speed", "30", "--every", "0.5", "--history-every",
         "1", "--poll", "0.05", "--interval", "0.5", "--budget", "10", "--database-url", "",
         "--json", str(out)]
    )  # fmt: skip
    result = json.loads(out.read_text())
    assert set(result) >= DAEMON_KEYS
    assert result["trace"]["driven_by"].startswith("scheduler daemon on the demo")
    assert result["submitted_by_load"] > 0 and result["jobs_started"] > 0
    assert result["estimated_unrecorded"] == 0
    from scheduler.models import Job

    seeded = Job.objects.filter(name__in=["llama-70b-pretrain", "detector-sweep"])
    assert seeded.exists() and not seeded.filter(allocations__isnull=False).exists()
