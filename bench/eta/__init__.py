"""How good are the start estimates? Replay a trace, estimate while jobs wait, compare.

    python -m bench.eta --json out.json                  # through the daemon (PostgreSQL)
    python -m bench.eta --engine-only --json out.json    # on virtual time, in scheduler.sim
    python -m bench.eta --engine-only --fraction 1       # the whole cohort (slow)
    python -m bench.eta --engine-only --cohorts 5 --fraction 1   # the whole scenario
    python -m bench.eta --engine-only --runtimes recurring       # runtimes near their group's
    python -m bench.eta --engine-only --oracle runtimes          # the error split by cause
    python -m bench.eta --engine-only --breakdown                # by wait ahead and class
    python -m bench.eta --demo --breakdown                       # the same, the demo load
    python -m bench.eta --demo --minutes 10                      # the demo load, the daemon
    python -m bench.eta --calibrate ...                          # corrected by the record

The trace is the Kueue scenario's (bench.kueue_baseline: cohorts of 6 teams, 20 GPUs
guaranteed each, 15 nodes of 8 GPUs per cohort, the same arrivals and classes): by default a
fifth of each class's jobs of one cohort (600 jobs), arrivals and durations stretched
(``--stretch``) so that they last seconds rather than tenths.

By default the trace goes through the real daemon on the simulated cluster, on wall-clock
time (bench.eta.daemon): a submitter process inserts the jobs at their arrival times, the
daemon refreshes the estimates by its own path (``scheduler.estimates.refresh``, every ``--every`` =
GANTRY_ETA_EVERY_S, within ``--budget`` = GANTRY_ETA_BUDGET_S, the runtime history re-read
every ``--history-every``), and a recorder process polls the estimates table, recording every
estimate made for every job while it waited. Stretched x10 the default trace runs in about
three minutes; ``--stretch 1`` jobs last tenths of a second, shorter than a refresh.

``--engine-only`` replays on virtual time through ``scheduler.sim`` instead, for traces too
long for wall-clock time (default stretch 1, ``--every`` 2 virtual s). The estimator is the
daemon's own (``scheduler.sim.runtimes.estimate_queue``, which ``scheduler.estimates.refresh``
stores): every ``--every`` virtual seconds the replay's present (its snapshot) is estimated with
runtimes from the history of the jobs finished so far, and every estimate of every waiting
job is recorded.

Kueue's jobs declare no max runtime and all of a class take the same time; here each job
declares a max of twice its class's duration and takes a seeded random part of it
(triangular between 0.1 and 1 of the max, mode 0.3), so the history has something to
correct. Jobs are grouped as the daemon groups them: user, project and team = the job's
team, type = its class, size = its GPUs.

Reports the median and p90 absolute error of the p50 estimate against the actual start
(seconds), the median of that error over the wait still ahead, the share of estimates of
waits under 10 minutes within a minute, and the share of estimates whose actual start fell
inside p50..p90 (JSON keys ``estimates``, ``median_abs_error_s``, ``p90_abs_error_s``,
``median_abs_error_rel``, ``within_60s_share``, ``coverage``; beside them the error over
the job's whole wait, ``median_abs_error_rel_of_wait``, and each wait's first estimate alone,
``first_estimates``), and under ``baseline`` the same figures for the naive estimates
(``NAIVE``) made at the same moments; ``--breakdown`` adds them split by the wait ahead,
the predicted wait and the class (``bench.eta.breakdown``; through the daemon the class is
the job's priority class and type).
"""

from __future__ import annotations

import argparse
import bisect
import json
import os
import random
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from bench.bench_profile import add_profile_argument, announced
from bench.kueue_baseline import CLASSES, TEAMS_PER_COHORT, cluster
from scheduler.core import Profile
from scheduler.core.types import JobRequest, Resources, Snapshot
from scheduler.sim import SimConfig, Simulation, WorkloadJob
from scheduler.sim.arrivals import LATE_WINDOWS, ExpectedRanges, expected_ranges
from scheduler.sim.calibration import Calibration, EstimateLog
from scheduler.sim.engine import StartState
from scheduler.sim.runtimes import (
    Finished,
    Groups,
    RuntimeModel,
    estimate_queue,
    groups_of,
    quantile,
)

# The naive estimator the figures are set beside: every job runs its declared max (no
# history, no submitter's estimate), as the estimates were before they learned runtimes.
NAIVE = RuntimeModel([])


# How a job's runtime is drawn (``--runtimes``), as a share of its declared max:
# - "independent": each job at random (triangular between 0.1 and 1, mode 0.3), whatever its
#   team or class: no history can predict one job better than the whole spread;
# - "recurring": each (team, class) has a typical share drawn once from that distribution,
#   and each of its jobs runs that share times a lognormal factor (sigma RECURRING_SIGMA),
#   within 0.05 and 1. The ML-cluster trace studies (Philly, Jeon et al. ATC'19; Helios, Hu
#   et al. SC'21; Alibaba PAI, Weng et al. NSDI'22) find most jobs recurring, with the past
#   runs of the same user and job predicting the duration; the spread is this bench's
#   assumption, not a figure from them.
RUNTIMES = ("independent", "recurring")
RECURRING_SIGMA = 0.2


def workload(
    cohorts: int,
    fraction: float,
    seed: int,
    stretch: float = 1.0,
    runtimes: str = "independent",
) -> list[WorkloadJob]:
    """The Kueue arrivals (``fraction`` of each class's jobs per team), each job declaring
    twice its class's duration as its max and taking a part of it drawn as ``runtimes``
    says (``RUNTIMES``); arrivals and durations times ``stretch``."""
    assert runtimes in RUNTIMES, runtimes
    rng = random.Random(seed)
    jobs = []
    teams = [f"cohort-{c}-team-{t}" for c in range(cohorts) for t in range(TEAMS_PER_COHORT)]
    for team in teams:
        for name, (count, gpus, replicas, duration, interval, _) in CLASSES.items():
            # drawn only for "recurring": the independent trace stays the one measured before
            typical = rng.triangular(0.1, 1.0, 0.3) if runtimes == "recurring" else 0.0
            for i in range(max(1, round(count * fraction))):
                declared = 2 * duration * stretch
                request = JobRequest(
                    f"{team}-{name}-{i}",
                    team,
                    name,
                    Resources(gpu_milli=gpus * 1000),
                    replicas,
                    user=team,
                    max_runtime_s=declared,
                )
                if runtimes == "recurring":
                    share = typical * rng.lognormvariate(0.0, RECURRING_SIGMA)
                    ran = declared * min(1.0, max(0.05, share))
                else:
                    ran = declared * rng.triangular(0.1, 1.0, 0.3)
                jobs.append(WorkloadJob(request, round(i * interval * stretch, 6), ran))
    return jobs


def group(job: JobRequest) -> Groups:
    size = job.resources.gpu_milli * job.replicas
    return groups_of(job.tenant, job.tenant, job.priority_class, size, job.user)


@dataclass(frozen=True)
class Estimate:
    job: str
    at: float
    p50: float | None
    p90: float | None


class EstimatingReplay(Simulation):
    """The replay, estimating its own present before a cycle once every ``every_s``."""

    def __init__(
        self,
        *args: object,
        every_s: float,
        max_jobs: int,
        oracle: str = "",
        calibrate: bool = False,
        arrivals_window_s: float = 0.0,
        arrivals_max: int = 0,
        arrivals_in_p50: bool = True,
        arrivals_late_windows: float = LATE_WINDOWS,
        **kwargs: object,
    ) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self.every_s, self.max_jobs, self.oracle = every_s, max_jobs, oracle
        self.arrivals_window_s, self.arrivals_max = arrivals_window_s, arrivals_max
        self.arrivals_in_p50 = arrivals_in_p50
        self.arrivals_late_windows = arrivals_late_windows
        self.expected: list[int] = []  # arrivals expected at each estimate
        self.estimated_at = -self.every_s
        self.estimates: list[Estimate] = []
        # The estimator's own record (the daemon's EtaRefresher keeps one the same way); the
        # replay's estimates before correction are kept too, for `uncalibrated`.
        self.log = EstimateLog(Calibration(floor_s=every_s)) if calibrate else None
        self.raw: list[Estimate] = []
        self.naive: list[Estimate] = []
        self.estimate_wall_s: list[float] = []

    def _cycle(self) -> None:
        if self.now - self.estimated_at >= self.every_s:
            self.estimated_at = self.now
            self._estimate()
        super()._cycle()

    def _estimate(self) -> None:
        started = time.perf_counter()
        snapshot = self._snapshot()
        # learned from the jobs finished so far only: never a waiting or running job's own
        model = RuntimeModel(
            Finished(group(t.request), t.spec.duration_s, t.request.max_runtime_s)
            for t in self.tracks.values()
            if t.state == "succeeded"
        )
        jobs = [*snapshot.pending, *(r.job for r in snapshot.running)]
        groups = {j.id: group(j) for j in jobs}
        if self.oracle:
            ranges = self._oracle(snapshot)
        else:
            arrivals = self._expected_arrivals(groups)
            found = estimate_queue(
                snapshot,
                self.profile,
                model,
                groups,
                max_jobs=self.max_jobs,
                arrivals=arrivals.p50,
                arrivals_in_p50=self.arrivals_in_p50,
                arrivals_p90=arrivals.p90,
            )
            ranges = found.ranges
        if self.log is not None:
            ranges = self._calibrated(ranges, groups)
        for job_id, (p50, p90) in ranges.items():
            self.estimates.append(Estimate(job_id, self.now, p50, p90))
        self.estimate_wall_s.append(time.perf_counter() - started)
        naive = estimate_queue(snapshot, self.profile, NAIVE, {}, max_jobs=self.max_jobs)
        for job_id, (p50, p90) in naive.ranges.items():
            self.naive.append(Estimate(job_id, self.now, p50, p90))

    def _expected_arrivals(self, groups: dict[str, Groups]) -> ExpectedRanges:
        """The arrivals the daemon would expect (``--arrivals-window``), from the jobs
        submitted so far only; their templates' groups are added to ``groups``."""
        if self.arrivals_window_s <= 0:
            return ExpectedRanges((), ())
        submitted = (t.request for t in self.tracks.values() if t.spec.arrival_s <= self.now)
        arrivals = expected_ranges(
            submitted,
            self.now,
            window_s=self.arrivals_window_s,
            max_count=self.arrivals_max,
            late_windows=self.arrivals_late_windows,
        )
        for a in (*arrivals.p50, *arrivals.p90):
            groups.setdefault(a.like, group(a.job))
        self.expected.append(len(arrivals.p50))
        return arrivals

    def _calibrated(
        self, ranges: dict[str, tuple[float | None, float | None]], groups: dict[str, Groups]
    ) -> dict[str, tuple[float | None, float | None]]:
        """Settle the record with the jobs that left the queue since (each estimate against
        the start that ended its wait), keep the replay's ranges in it, and return them
        corrected by it."""
        assert self.log is not None
        gone = [j for j in self.log.waiting if j not in self.pending]
        self.log.settle({j: self.tracks[j].starts for j in gone if self.tracks[j].starts})
        self.log.record(self.now, ranges, groups)
        self.raw += [Estimate(j, self.now, p50, p90) for j, (p50, p90) in ranges.items()]
        adjust, waiting = self.log.calibration.adjust, self.log.waiting_scores(self.now)
        return {j: adjust(groups.get(j, ()), self.now, *r, waiting) for j, r in ranges.items()}

    def _oracle(self, snapshot: Snapshot) -> dict[str, tuple[float | None, float | None]]:
        """The estimates of an estimator that knows what the replay will do (``ORACLES``):
        every job's true runtime (what is left of it), and with "all" the jobs still to
        arrive as well. What error is left is the other causes' share."""
        left = {t.request.id: t.spec.duration_s - t.done_s for t in self.tracks.values()}
        now = snapshot.now
        work = [
            WorkloadJob(j, now, left[j.id], submitted_at=j.submitted_at) for j in snapshot.pending
        ]
        if self.oracle == "all":
            work += [
                t.spec
                for t in self.tracks.values()
                if t.state == "pending" and t.request.id not in self.pending
            ]
        ends = {r.job.id: r.started_at + left[r.job.id] for r in snapshot.running}
        start = StartState(now, snapshot.running, ends, snapshot.decayed_usage)
        waiting = {j.id for j in snapshot.pending}

        def settled() -> bool:  # every waiting job started: the rest is of no interest
            return all(replay.tracks[j].first_start is not None for j in waiting)

        replay = Simulation(work, self.cluster, self.profile, (), self.config, start, settled)
        replay.replay()
        return {j: (replay.tracks[j].first_start,) * 2 for j in waiting}


# Estimators that know the future, to split the error by cause (``--oracle``): "runtimes"
# knows every job's runtime, "all" also the arrivals to come.
ORACLES = ("runtimes", "all")


# An estimate's error is judged against the wait still ahead of the job when it was made;
# a wait under a second (a job the engine starts in the cycle that estimated it) counts as
# one second, so that the relative error stays finite.
MIN_WAIT_S = 1.0
# "Short" waits, and the error that counts as right for them (the ML predictors' figure).
SHORT_WAIT_S = 600.0
WITHIN_S = 60.0


def next_start(starts: Sequence[float], at: float) -> float | None:
    """The start that ends the wait an estimate made at ``at`` predicted: the job's first
    start at or after it (``starts`` sorted). A job preempted and requeued waits again:
    the estimates made then predict its next start, not its first."""
    index = bisect.bisect_left(starts, at)
    return starts[index] if index < len(starts) else None


def score(estimates: list[Estimate], starts: Mapping[str, Sequence[float]]) -> dict[str, object]:
    """Errors of the p50 estimates against the actual starts, and the p50..p90 coverage,
    over every estimate of a job that started after it (``next_start``: ``starts`` holds
    each job's starts, sorted; an estimate of "not within the horizon" for a job that
    started counts as a miss of the range and is left out of the errors). A
    calibrated estimator covers 0.4 (its p50..p90): `early` and `late` say on which side
    the misses fall (actual start before the p50, after the p90). `median_abs_error_rel`:
    the median of each p50's error over the wait still ahead when it was made (at least
    MIN_WAIT_S); `within_60s_share`: of the estimates made less than SHORT_WAIT_S before the
    actual start, the share whose p50 was within WITHIN_S of it."""
    errors, relative, of_wait, inside, beyond, early = [], [], [], 0, 0, 0
    short = short_right = 0
    judged = []
    for e in estimates:
        actual = next_start(starts.get(e.job, ()), e.at)
        if actual is not None:
            judged.append((e, actual))
    began = waits_began(judged)
    firsts = []
    for e, actual in judged:
        wait = actual - e.at
        short += wait < SHORT_WAIT_S
        if e.p50 is None:
            beyond += 1
            continue
        error = abs(actual - e.p50)
        errors.append(error)
        relative.append(error / max(MIN_WAIT_S, wait))
        whole = actual - began[e.job, actual]
        of_wait.append(error / max(MIN_WAIT_S, whole))
        if e.at == began[e.job, actual]:
            firsts.append((e, actual))
        short_right += wait < SHORT_WAIT_S and error <= WITHIN_S
        late = e.p90 if e.p90 is not None else float("inf")
        inside += e.p50 <= actual <= late
        early += actual < e.p50
    return {
        "estimates": len(judged),
        "median_abs_error_s": round(quantile(errors, 0.5), 3) if errors else None,
        "p90_abs_error_s": round(quantile(errors, 0.9), 3) if errors else None,
        "median_abs_error_rel": round(quantile(relative, 0.5), 4) if relative else None,
        "median_abs_error_rel_of_wait": round(quantile(of_wait, 0.5), 4) if of_wait else None,
        "first_estimates": _firsts(firsts),
        "within_60s_share": round(short_right / short, 4) if short else None,
        "coverage": round(inside / len(judged), 4) if judged else None,
        "early": round(early / len(judged), 4) if judged else None,
        "late": round((len(judged) - beyond - inside - early) / len(judged), 4) if judged else None,
        "estimates_beyond_horizon": beyond,
    }


def waits_began(judged: Sequence[tuple[Estimate, float]]) -> dict[tuple[str, float], float]:
    """When each wait began, as far as the estimates saw it: (job, the start that ended the
    wait) -> the time of its first estimate (a refresh period or less after the job's
    submission or requeue, so a wait counts a little short, never long)."""
    began: dict[tuple[str, float], float] = {}
    for e, actual in judged:
        key = (e.job, actual)
        began[key] = min(began.get(key, e.at), e.at)
    return began


def _firsts(firsts: Sequence[tuple[Estimate, float]]) -> dict[str, object]:
    """The figures of each wait's first estimate (the one a submitter sees on submitting):
    their count, the median of the p50's error over the wait, and the p50..p90 coverage."""
    relative = [abs(a - e.p50) / max(MIN_WAIT_S, a - e.at) for e, a in firsts if e.p50 is not None]
    inside = sum(
        e.p50 is not None and e.p50 <= a <= (e.p90 if e.p90 is not None else float("inf"))
        for e, a in firsts
    )
    return {
        "waits": len(firsts),
        "median_abs_error_rel": round(quantile(relative, 0.5), 4) if relative else None,
        "coverage": round(inside / len(firsts), 4) if firsts else None,
    }


def scored(
    estimates: list[Estimate], naive: list[Estimate], starts: Mapping[str, Sequence[float]]
) -> dict[str, object]:
    """`score` of the estimator, with `baseline`: the same figures for the naive estimates
    (`NAIVE`: every job runs its declared max) made at the same moments."""
    return score(estimates, starts) | {"baseline": score(naive, starts)}


def run(
    profile: Profile,
    *,
    cohorts: int,
    fraction: float,
    every_s: float,
    max_jobs: int,
    seed: int,
    stretch: float = 1.0,
    runtimes: str = "independent",
    oracle: str = "",
    calibrate: bool = False,
    arrivals_window_s: float = 0.0,
    arrivals_max: int = 0,
    arrivals_in_p50: bool = True,
    arrivals_late_windows: float = LATE_WINDOWS,
    split: bool = False,
) -> dict[str, object]:
    """The trace replayed on virtual time, its estimates scored (``scored``); with
    ``split``, also their error by the wait ahead, the predicted wait and the class
    (``bench.eta.breakdown``)."""
    from bench.eta.breakdown import breakdown

    jobs = workload(cohorts, fraction, seed, stretch, runtimes)
    replay = EstimatingReplay(
        jobs,
        cluster(cohorts),
        profile,
        (),
        SimConfig(tick_s=1.0),
        every_s=every_s,
        max_jobs=max_jobs,
        oracle=oracle,
        calibrate=calibrate,
        arrivals_window_s=arrivals_window_s,
        arrivals_max=arrivals_max,
        arrivals_in_p50=arrivals_in_p50,
        arrivals_late_windows=arrivals_late_windows,
    )
    report = replay.run()
    starts = {j.id: j.starts_s for j in report.jobs}
    waits = [j.first_start_s - j.arrival_s for j in report.jobs if j.first_start_s is not None]
    walls = replay.estimate_wall_s
    raw: dict[str, object] = {"uncalibrated": score(replay.raw, starts)} if calibrate else {}
    if split:
        classes = {j.request.id: j.request.priority_class for j in jobs}
        raw |= {"breakdown": breakdown(replay.estimates, starts, classes)}
    return (
        scored(replay.estimates, replay.naive, starts)
        | raw
        | {
            "jobs": len(jobs),
            "jobs_estimated": len({e.job for e in replay.estimates}),
            "wait_median_s": round(quantile(waits, 0.5), 3) if waits else None,
            "wait_p90_s": round(quantile(waits, 0.9), 3) if waits else None,
            "refreshes": len(walls),
            "expected_arrivals_median": quantile(replay.expected, 0.5) if replay.expected else 0,
            "refresh_wall_median_s": round(quantile(walls, 0.5), 4) if walls else None,
            "refresh_wall_max_s": round(max(walls), 4) if walls else None,
            "makespan_s": round(report.makespan_s, 2),
            "trace": {
                "scenario": "kueue_baseline",
                "cohorts": cohorts,
                "fraction": fraction,
                "stretch": stretch,
                "seed": seed,
                "runtimes": runtimes,
                "oracle": oracle or None,
                "calibrated": calibrate,
                "every_s": every_s,
                "max_jobs": max_jobs,
                "arrivals_window_s": arrivals_window_s,
                "arrivals_max": arrivals_max,
                "arrivals_in_p50": arrivals_in_p50,
                "arrivals_late_windows": arrivals_late_windows,
                "driven_by": "scheduler.sim (virtual time)",
            },
        }
    )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Accuracy of the queue's start estimates")
    parser.add_argument("--json", type=Path)
    parser.add_argument(
        "--engine-only",
        action="store_true",
        help="replay in scheduler.sim on virtual time instead of through the daemon",
    )
    parser.add_argument("--cohorts", type=int, default=1, help="cohorts of 6 teams (Kueue: 5)")
    parser.add_argument(
        "--fraction", type=float, default=0.2, help="share of each class's jobs per team"
    )
    parser.add_argument(
        "--stretch",
        type=float,
        help="arrivals and durations times this (default 10 through the daemon, 1 engine-only)",
    )
    parser.add_argument(
        "--every",
        type=float,
        help="s between estimates: GANTRY_ETA_EVERY_S (default 1 wall s through the daemon, "
        "2 virtual s engine-only)",
    )
    parser.add_argument("--max-jobs", type=int, default=2000, help="GANTRY_ETA_MAX_JOBS")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument(
        "--runtimes",
        choices=RUNTIMES,
        default="independent",
        help="how each job's runtime is drawn (see RUNTIMES)",
    )
    parser.add_argument(
        "--calibrate",
        action=argparse.BooleanOptionalAction,
        default=False,
        help="correct the replay's ranges by the estimator's own record "
        "(scheduler.sim.calibration, EtaSettings.calibrate); engine-only, the replay's own "
        "figures are then under 'uncalibrated' (an --oracle is never corrected)",
    )
    parser.add_argument(
        "--arrivals-window",
        type=float,
        default=0.0,
        help="expect arrivals like those of the last so many s (scheduler.sim.arrivals, "
        "GANTRY_ETA_ARRIVALS_WINDOW_S; 0: none)",
    )
    parser.add_argument(
        "--arrivals-max",
        type=int,
        default=200,
        help="at most so many expected arrivals (GANTRY_ETA_ARRIVALS_MAX)",
    )
    parser.add_argument(
        "--arrivals-in-p50",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="engine-only: the expected arrivals join the p50 replay too (else the p90's alone)",
    )
    parser.add_argument(
        "--arrivals-late-windows",
        type=float,
        default=LATE_WINDOWS,
        help="the p90 replay's arrivals are read and expected over this many windows "
        "(scheduler.sim.arrivals.LATE_WINDOWS; 1: the p50's)",
    )
    parser.add_argument(
        "--oracle",
        choices=ORACLES,
        help="engine-only: estimate knowing the true runtimes ('runtimes') and the arrivals "
        "to come ('all'), to split the error by cause",
    )
    parser.add_argument(
        "--breakdown",
        action="store_true",
        help="the error also by the wait ahead, the predicted wait and the class "
        "(bench.eta.breakdown; through the daemon, the class is the job's priority class "
        "and type)",
    )
    daemon = parser.add_argument_group("through the daemon")
    daemon.add_argument("--budget", type=float, default=1.0, help="GANTRY_ETA_BUDGET_S")
    daemon.add_argument(
        "--history-every", type=float, default=5.0, help="s between reads of the runtime history"
    )
    daemon.add_argument("--poll", type=float, default=0.1, help="recorder's polling period, s")
    daemon.add_argument("--interval", type=float, default=1.0, help="daemon polling fallback, s")
    daemon.add_argument("--limit", type=float, default=900.0, help="give up after, s")
    daemon.add_argument(
        "--database-url",
        default="postgres://postgres@127.0.0.1:5432/gantry_eta",
        help="PostgreSQL database, dropped and created afresh; '' for the database Django is "
        "already set up on (it must hold no jobs)",
    )
    demo = parser.add_argument_group("the demo load through the daemon (--demo)")
    demo.add_argument(
        "--demo",
        action="store_true",
        help="the demo organisation, cluster and load generator instead of the trace",
    )
    demo.add_argument("--minutes", type=float, default=10.0, help="how long the load runs")
    demo.add_argument(
        "--speed", type=float, default=10.0, help="the demo's durations and period divided by"
    )
    add_profile_argument(parser, "no-min-runtime")
    args = parser.parse_args(argv)
    loaded, used = announced(args.profile)
    started = time.perf_counter()
    load_before = os.getloadavg()
    if args.engine_only:
        stretch, every = args.stretch or 1.0, args.every or 2.0
        out = run(
            loaded.profile,
            cohorts=args.cohorts,
            fraction=args.fraction,
            every_s=every,
            max_jobs=args.max_jobs,
            seed=args.seed,
            stretch=stretch,
            runtimes=args.runtimes,
            oracle=args.oracle or "",
            calibrate=args.calibrate and not args.oracle,
            arrivals_window_s=args.arrivals_window,
            arrivals_max=args.arrivals_max,
            arrivals_in_p50=args.arrivals_in_p50,
            arrivals_late_windows=args.arrivals_late_windows,
            split=args.breakdown,
        )
    elif args.demo:
        out = run_demo(args, loaded.profile, every_s=args.every or 1.0)
    else:
        stretch, every = args.stretch or 10.0, args.every or 1.0
        out = run_daemon(args, loaded.profile, stretch=stretch, every_s=every)
    out |= {
        "profile": used,
        "wall_s": round(time.perf_counter() - started, 1),
        "host": {
            "cpus": os.cpu_count(),
            "loadavg_before": [round(x, 2) for x in load_before],
            "loadavg_after": [round(x, 2) for x in os.getloadavg()],
        },
    }
    print(json.dumps(out, indent=2))
    if args.json:
        args.json.write_text(json.dumps(out, indent=2) + "\n")


def run_demo(args: argparse.Namespace, profile: Profile, *, every_s: float) -> dict[str, object]:
    """The demo mode (bench.eta.demo) on a fresh PostgreSQL database."""
    from bench.daemon_setup import fresh_database
    from bench.eta import demo as eta_demo

    if args.database_url:
        fresh_database(args.database_url)
    with tempfile.TemporaryDirectory(prefix="bench-eta-demo-") as workdir:
        out: dict[str, object] = eta_demo.run(
            profile,
            minutes=args.minutes,
            speed=args.speed,
            seed=args.seed,
            every_s=every_s,
            budget_s=args.budget,
            max_jobs=args.max_jobs,
            history_every_s=args.history_every,
            poll_s=args.poll,
            interval_s=args.interval,
            calibrate=args.calibrate,
            workdir=Path(workdir),
            arrivals_window_s=args.arrivals_window,
            arrivals_max=args.arrivals_max,
            arrivals_late_windows=args.arrivals_late_windows,
            split=args.breakdown,
        )
    return out | {
        "trace": {
            "scenario": "demo load (scheduler.demo.load)",
            "minutes": args.minutes,
            "speed": args.speed,
            "seed": args.seed,
            "calibrated": args.calibrate,
            "every_s": every_s,
            "budget_s": args.budget,
            "history_every_s": args.history_every,
            "max_jobs": args.max_jobs,
            "arrivals_window_s": args.arrivals_window,
            "arrivals_max": args.arrivals_max,
            "arrivals_late_windows": args.arrivals_late_windows,
            "driven_by": "scheduler daemon on the demo's simulated cluster (wall-clock time)",
        }
    }


def run_daemon(
    args: argparse.Namespace, profile: Profile, *, stretch: float, every_s: float
) -> dict[str, object]:
    """The daemon mode (bench.eta.daemon) on a fresh PostgreSQL database."""
    from bench.daemon_setup import fresh_database
    from bench.eta import daemon as eta_daemon

    if args.database_url:
        fresh_database(args.database_url)
    with tempfile.TemporaryDirectory(prefix="bench-eta-") as workdir:
        out: dict[str, object] = eta_daemon.run(
            profile,
            cohorts=args.cohorts,
            fraction=args.fraction,
            stretch=stretch,
            seed=args.seed,
            runtimes=args.runtimes,
            calibrate=args.calibrate,
            every_s=every_s,
            budget_s=args.budget,
            max_jobs=args.max_jobs,
            history_every_s=args.history_every,
            poll_s=args.poll,
            interval_s=args.interval,
            limit_s=args.limit,
            workdir=Path(workdir),
            arrivals_window_s=args.arrivals_window,
            arrivals_max=args.arrivals_max,
            arrivals_late_windows=args.arrivals_late_windows,
            split=args.breakdown,
        )
    return out | {
        "trace": {
            "scenario": "kueue_baseline",
            "cohorts": args.cohorts,
            "fraction": args.fraction,
            "stretch": stretch,
            "seed": args.seed,
            "runtimes": args.runtimes,
            "calibrated": args.calibrate,
            "every_s": every_s,
            "budget_s": args.budget,
            "history_every_s": args.history_every,
            "max_jobs": args.max_jobs,
            "arrivals_window_s": args.arrivals_window,
            "arrivals_max": args.arrivals_max,
            "arrivals_late_windows": args.arrivals_late_windows,
            "driven_by": "scheduler daemon on the simulated cluster (wall-clock time)",
        }
    }
