"""`python -m bench.eta`'s daemon mode: the trace replayed through the real scheduler daemon
on the simulated cluster, on wall-clock time, as bench.kueue_e2e replays Kueue's scenario.

Three processes share one database:

- the submitter inserts each job as a queued row at its arrival time (bench.kueue_e2e's,
  without `job_submit`'s per-request validation), with its declared max runtime;
- the daemon (this process) schedules, runs the jobs on the simulated cluster for their
  durations, and refreshes the queue's estimates by its own path (`scheduler.estimates.refresh`'s
  `EtaRefresher` after a cycle, every GANTRY_ETA_EVERY_S within GANTRY_ETA_BUDGET_S);
- the recorder polls `JobQueueEstimate` every `poll_s`: the daemon keeps only the latest
  estimate of each job, so every (job, estimated_at) pair seen is recorded once. When it sees
  a refresh it also makes the naive estimate (`bench.eta.NAIVE`: every job runs its
  declared max) of the queue as it stands then, read by `build_snapshot` (fair share from
  no usage history: the daemon's decayed usage is its own), for `baseline`.

A job's actual start is the `admitted` event that ended the wait an estimate was made in:
its first admission, or after a requeue the next one (`bench.eta.next_start`).
The daemon also notes, after each refresh, which jobs it estimated then (ids only, from the
table): `estimated_unrecorded` counts those the recorder never saw, so the figures say
whether polling kept up.
"""

from __future__ import annotations

import json
import multiprocessing
import time
from collections.abc import Mapping
from datetime import datetime
from pathlib import Path
from typing import Any

from bench.eta import NAIVE, Estimate, scored, workload
from bench.kueue_baseline import CLASSES, NODES_PER_COHORT
from bench.kueue_e2e import CLASSES as E2E_CLASSES
from bench.kueue_e2e import scenario_teams
from scheduler.core import Profile
from scheduler.sim.arrivals import LATE_WINDOWS
from scheduler.sim.runtimes import quantile

FLAVOR = "gpu"
# How long the replay waits for the daemon's estimates worker to be set up (PostgreSQL).
WORKER_READY_S = 120.0


def setup(cohorts: int) -> tuple[dict[str, Any], dict[str, Any]]:
    """Bench.kueue_e2e's organisation for `cohorts` cohorts: teams guaranteed 20 GPUs,
    borrowing up to 120 within their cohort, cohorts lending nothing to each other."""
    from bench.daemon_setup import organisation
    from tenants.models import PriorityClass

    org = organisation(scenario_teams(cohorts, FLAVOR))
    # bench.kueue_e2e's values: the same order as the engine's, clear of the built-in classes
    classes = {
        name: PriorityClass.objects.create(
            name=f"eta-{name}", value=E2E_CLASSES[name][5], may_preempt=True
        )
        for name in CLASSES
    }
    return org, classes


def plan(
    org: Mapping[str, Any],
    classes: Mapping[str, Any],
    *,
    cohorts: int,
    fraction: float,
    stretch: float,
    seed: int,
    runtimes: str = "independent",
) -> list[tuple[float, dict[str, Any]]]:
    """(arrival s, spec for `job_rows`) of the engine mode's trace, in arrival order. The
    declared max is whole seconds (the column's unit): rounded up, with the actual runtime
    scaled to keep its share of it."""
    out = []
    for job in workload(cohorts, fraction, seed, stretch, runtimes):
        request = job.request
        declared = max(1, -int(-(request.max_runtime_s or 1.0) // 1))
        share = job.duration_s / (request.max_runtime_s or 1.0)
        spec = {
            "team": org[request.tenant],
            "name": request.id,
            "gpus": request.resources.gpu_milli // 1000,
            "replicas": request.replicas,
            "duration_s": round(declared * share, 3),
            "priority": classes[request.priority_class],
            "max_runtime_s": declared,
        }
        out.append((job.arrival_s, spec))
    return sorted(out, key=lambda item: item[0])


def recorder(out: Path, poll_s: float, stop: Any, profile: Profile, max_jobs: int) -> None:
    """The recording process: every `poll_s`, the rows of refreshes it has not seen
    (`computed_at` moved), each (job, estimated_at) kept once, and after each refresh seen
    the naive estimate of the queue then. Written to `out` at the end."""
    from django.db import connection

    from bench.daemon_setup import forget_inherited_connections
    from scheduler.models import JobQueueEstimate

    forget_inherited_connections()
    seen: dict[tuple[int, float], tuple[float | None, float | None]] = {}
    naive: list[list[Any]] = []
    refreshes: set[float] = set()
    last = None
    while True:
        ending = stop.is_set()  # one more read after the stop, for the last refresh
        rows = JobQueueEstimate.objects.all()
        if last is not None:
            rows = rows.filter(computed_at__gt=last)
        before = len(refreshes)
        for job_id, computed, estimated, p50, p90 in rows.values_list(
            "job_id", "computed_at", "estimated_at", "eta_p50", "eta_p90"
        ):
            refreshes.add(computed.timestamp())
            last = computed if last is None or computed > last else last
            if estimated is not None:
                seen.setdefault((job_id, estimated.timestamp()), (_stamp(p50), _stamp(p90)))
        if len(refreshes) > before and not ending:
            naive += _naive(profile, max_jobs)
        if ending:
            break
        time.sleep(poll_s)
    connection.close()
    records = [[job, at, p50, p90] for (job, at), (p50, p90) in seen.items()]
    out.write_text(
        json.dumps({"estimates": records, "naive": naive, "refreshes_seen": len(refreshes)})
    )


def _naive(profile: Profile, max_jobs: int) -> list[list[Any]]:
    """The naive estimates of the queue as it stands now: [job, at, p50, p90] each."""
    from scheduler.sim.runtimes import estimate_queue
    from scheduler.snapshot.build import build_snapshot

    now = time.time()
    snapshot = build_snapshot(now, decayed={}, max_pending=100_000, per_queue=0).snapshot
    found = estimate_queue(snapshot, profile, NAIVE, {}, max_jobs=max_jobs)
    return [[job, now, p50, p90] for job, (p50, p90) in found.ranges.items()]


def _stamp(at: datetime | None) -> float | None:
    return None if at is None else at.timestamp()


def run(
    profile: Profile,
    *,
    cohorts: int,
    fraction: float,
    stretch: float,
    seed: int,
    runtimes: str = "independent",
    calibrate: bool = True,
    every_s: float,
    budget_s: float,
    max_jobs: int,
    history_every_s: float,
    poll_s: float,
    interval_s: float,
    limit_s: float,
    workdir: Path,
    arrivals_window_s: float = 0.0,
    arrivals_max: int = 200,
    arrivals_late_windows: float = LATE_WINDOWS,
    split: bool = False,
) -> dict[str, Any]:
    """The daemon-mode replay on the database Django is set up on (PostgreSQL or SQLite;
    it must be empty of jobs). Returns the figures and `bench.eta.score`'s."""
    from django.conf import settings
    from django.db import connections

    from bench.kueue_e2e import submitter
    from scheduler.backends.simulated.cluster import SimulatedCluster
    from scheduler.backends.simulated.inventory import make_nodes
    from scheduler.daemon.loop import Daemon
    from scheduler.estimates.refresh import EtaRefresher, EtaSettings
    from scheduler.leader import Lease

    org, classes = setup(cohorts)
    jobs = plan(
        org,
        classes,
        cohorts=cohorts,
        fraction=fraction,
        stretch=stretch,
        seed=seed,
        runtimes=runtimes,
    )
    backend = SimulatedCluster(
        make_nodes(NODES_PER_COHORT * cohorts, FLAVOR, 8), start_delay_s=0.0, grace_cap_s=0.0
    )
    config = EtaSettings(
        every_s,
        budget_s,
        max_jobs,
        settings.GANTRY_ETA_UNBOUNDED_RUNTIME_S,
        calibrate,
        arrivals_window_s,
        arrivals_max,
        arrivals_late_windows,
    )
    estimated: set[tuple[int, float]] = set()  # (job, estimated_at) per the daemon's refreshes
    refreshes: list[dict[str, Any]] = []
    cycles = 0

    def on_cycle(d: Daemon) -> None:
        """Note each refresh and whom it estimated; stop once every job succeeded (or at
        the limit)."""
        nonlocal cycles
        cycles += 1
        note_refresh(d, refreshes, estimated)
        over = time.time() - start >= limit_s
        if over or (cycles % 10 == 0 and not submitting.is_alive() and not _unfinished()):
            d.stop.set()

    # No queue window: every queued job is in the snapshot, so every one is estimated.
    daemon = Daemon(
        backend,
        lease=Lease(ttl_s=60),
        profile=profile,
        interval_s=interval_s,
        max_pending=100_000,
        per_queue=0,
        sync_every_s=1.0,
        on_cycle=on_cycle,
    )
    daemon.estimates = EtaRefresher(config=config, history_every_s=history_every_s)
    daemon.lease.acquire()
    daemon.sync_nodes(force=True)
    if connections["default"].vendor == "postgresql":
        # the daemon's loop refreshes in a worker there: its start (seconds under load) is
        # not the estimates' to pay, so the replay's clock starts with it set up
        daemon.estimates.start_background()
        daemon.estimates.wait_ready(WORKER_READY_S)
    connections.close_all()  # the forked processes open their own
    fork = multiprocessing.get_context("fork")
    stop = fork.Event()
    recorded = workdir / "estimates.json"
    start = time.time()
    submitting = fork.Process(target=submitter, args=(jobs, 0.05, start), daemon=True)
    recording = fork.Process(
        target=recorder, args=(recorded, poll_s, stop, profile, max_jobs), daemon=True
    )
    submitting.start()
    recording.start()
    try:
        daemon.run()
    finally:
        stop.set()
        submitting.join()
        recording.join()
    seen = json.loads(recorded.read_text())
    estimates = [Estimate(str(job), at, p50, p90) for job, at, p50, p90 in seen["estimates"]]
    naive = [Estimate(str(job), at, p50, p90) for job, at, p50, p90 in seen["naive"]]
    recorded_keys = {(int(e.job), e.at) for e in estimates}
    return _figures(
        estimates,
        naive,
        jobs=len(jobs),
        wall_s=time.time() - start,
        cycles=cycles,
        refreshes=refreshes,
        refreshes_seen=seen["refreshes_seen"],
        unrecorded=len(estimated - recorded_keys),
        split=split,
    )


def _unfinished() -> bool:
    """Some job not finished yet (a job preempted near its max runtime may fail: its
    deadline runs from its first start)."""
    from scheduler.models import FINAL_STATES, Job

    return Job.objects.exclude(state__in=FINAL_STATES).exists()


def _figures(
    estimates: list[Estimate],
    naive: list[Estimate],
    *,
    jobs: int,
    wall_s: float,
    cycles: int,
    refreshes: list[dict[str, Any]],
    refreshes_seen: int,
    unrecorded: int,
    split: bool = False,
) -> dict[str, Any]:
    """`bench.eta.scored` against each job's admissions, with the run's own counts; with
    `split`, the error split by the wait ahead, the predicted wait and the job's priority
    class and type (`bench.eta.breakdown`)."""
    from bench.eta.breakdown import breakdown
    from scheduler.models import Job, JobEvent

    rows = Job.objects.values_list("id", "created_at", "priority_class__name", "job_type")
    created, classes = {}, {}  # job id -> created at; -> "priority class/type" (`split`)
    for job_id, at, cls, kind in rows:
        created[str(job_id)] = at.timestamp()
        classes[str(job_id)] = f"{cls}/{kind}"
    admitted = JobEvent.objects.filter(to_state="admitted").values_list("job_id", "at")
    # every admission: an estimate made while a requeued job waited again is judged on the
    # admission that ended that wait (bench.eta.next_start)
    starts: dict[str, list[float]] = {job: [] for job in created}
    for job_id, at in admitted:
        starts.setdefault(str(job_id), []).append(at.timestamp())
    for times in starts.values():
        times.sort()
    started = {job for job, times in starts.items() if times}
    estimated_jobs = {e.job for e in estimates}
    waits = [times[0] - created[job] for job, times in starts.items() if times]
    walls = [r["ms"] / 1000 for r in refreshes]
    return (
        scored(estimates, naive, starts)
        | {
            "jobs": jobs,
            "jobs_started": len(started),
            "jobs_estimated": len(estimated_jobs),
            # admitted in the cycle after they arrived, before any refresh could see them wait
            "started_never_estimated": len(started - estimated_jobs),
            "estimated_unrecorded": unrecorded,
            "succeeded": Job.objects.filter(state="succeeded").count(),
            "failed": Job.objects.filter(state="failed").count(),
            "wait_median_s": round(quantile(waits, 0.5), 3) if waits else None,
            "wait_p90_s": round(quantile(waits, 0.9), 3) if waits else None,
            "refreshes": len(refreshes),
            # refreshes whose rows the recorder read (one of an empty queue writes none)
            "refreshes_seen": refreshes_seen,
            "refreshes_out_of_budget": sum(bool(r["stopped"]) for r in refreshes),
            "refresh_wall_median_s": round(quantile(walls, 0.5), 4) if walls else None,
            "refresh_wall_max_s": round(max(walls), 4) if walls else None,
            "cycles": cycles,
            "replay_wall_s": round(wall_s, 1),
        }
        | ({"breakdown": breakdown(estimates, starts, classes)} if split else {})
    )


def note_refresh(
    d: Any, refreshes: list[dict[str, Any]], estimated: set[tuple[int, float]]
) -> None:
    """After a cycle of the daemon `d`: the refresh it made since the last call, if any, and
    whom it estimated (Django set up)."""
    from scheduler.models import JobQueueEstimate

    if d.last is None or "estimates" not in d.last.phases_ms or not d.estimates.last:
        return
    at = d.estimates.refreshed_at
    if refreshes and refreshes[-1]["at"] == at:
        return
    refreshes.append(
        {"at": at, "ms": d.last.phases_ms["estimates"], "stopped": d.estimates.last.stopped}
    )
    for job_id, stamp in JobQueueEstimate.objects.values_list("job_id", "estimated_at"):
        if stamp is not None:
            estimated.add((job_id, stamp.timestamp()))
