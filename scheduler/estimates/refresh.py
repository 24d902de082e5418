"""Queue positions and start estimates of waiting jobs, refreshed by the leading daemon.

After a cycle, at most every GANTRY_ETA_EVERY_S of the daemon's clock (`EtaRefresher`):

1. snapshot: the queue and what runs, read afresh (after the cycle's own writes), as
   planned (the door's `as_planned`): jobs being preempted or requeued give their devices back now,
   and the requeued ones wait in the queue;
2. order: the engine's own order of the queue (`core.queue_order`), giving each job its
   position in the cluster and in its team;
3. estimate: the first GANTRY_ETA_MAX_JOBS jobs of that order replayed in `scheduler.sim`
   (whose engine plans the reclaims and preemptions to come) with runtimes learned from
   the history of similar finished jobs, bounded by their max (`sim.runtimes`), within
   GANTRY_ETA_BUDGET_S of wall time; a replay that runs out stops where it is, and the
   jobs it did not settle keep their previous estimates; with GANTRY_ETA_ARRIVALS_WINDOW_S
   the jobs expected meanwhile join the replay (`scheduler.estimates.arrivals`);
4. store: one `JobQueueEstimate` row per queued job, in one transaction that also drops the
   rows of jobs no longer queued.

Pages and the API only read the rows. docs/queue-estimates.md describes the method.
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import Future, ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import astuple, dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import DatabaseError, connection, transaction

from scheduler.core import Profile
from scheduler.estimates import worker as eta_worker
from scheduler.estimates.arrivals import arrivals_expected
from scheduler.leader import LeaseLost
from scheduler.models import Allocation, Job, JobQueueEstimate, JobState
from scheduler.sim.arrivals import LATE_WINDOWS, ExpectedArrival, ExpectedRanges
from scheduler.sim.calibration import Calibration, EstimateLog
from scheduler.sim.runtimes import Finished, Groups, RuntimeModel, estimate_queue, groups_of
from scheduler.snapshot.build import Snapshot, as_planned, build_snapshot
from scheduler.snapshot.translate import core_job_id, job_pk

log = logging.getLogger("gantry.eta")

# The history read for runtimes: finished jobs of the last HISTORY_DAYS, the latest
# HISTORY_ROWS of them, read again every HISTORY_EVERY_S (it moves slowly; the queue does not).
HISTORY_DAYS = 30
HISTORY_ROWS = 5000
HISTORY_EVERY_S = 600.0


@dataclass(frozen=True)
class EtaSettings:
    every_s: float
    budget_s: float
    max_jobs: int
    unbounded_runtime_s: float
    # Correct the replay's ranges by the record of past estimates (`sim.calibration`). Off
    # by default: on bench.eta's trace, whose load comes in one burst and drains, the record
    # of one phase misleads the next (docs/queue-estimates.md, "Accuracy").
    calibrate: bool = False
    # Expect arrivals like those of the last `arrivals_window_s` (0: none), at most
    # `arrivals_max` of them within as long again (`scheduler.estimates.arrivals`).
    arrivals_window_s: float = 0.0
    arrivals_max: int = 200
    # The p90 replay's arrivals over this many windows (`sim.arrivals.expected_ranges`).
    arrivals_late_windows: float = LATE_WINDOWS

    @classmethod
    def from_settings(cls) -> EtaSettings:
        return cls(
            settings.GANTRY_ETA_EVERY_S,
            settings.GANTRY_ETA_BUDGET_S,
            settings.GANTRY_ETA_MAX_JOBS,
            settings.GANTRY_ETA_UNBOUNDED_RUNTIME_S,
            arrivals_window_s=settings.GANTRY_ETA_ARRIVALS_WINDOW_S,
            arrivals_max=settings.GANTRY_ETA_ARRIVALS_MAX,
        )


@dataclass(frozen=True)
class Refreshed:
    """What one refresh did: rows written, jobs whose estimate is new, and whether the
    budget or the cap left some with their previous one."""

    positions: int
    estimated: int
    stopped: bool
    capped: int


def _dt(at: float | None) -> datetime | None:
    return None if at is None else datetime.fromtimestamp(at, tz=UTC)


def job_groups(row: Mapping[str, Any]) -> Groups:
    size = row["replicas"] * row["gpu_milli_per_replica"]
    user = row.get("submitted_by_id")
    return groups_of(row["project_id"], row["tenant_id"], row["job_type"], size, user)


def runtime_history(now: datetime, unbounded_runtime_s: float) -> RuntimeModel:
    """How long the jobs that finished lately ran, against their max when they declared
    one (succeeded or failed: either way their devices came back then; a cancel says
    nothing about the work). The running jobs join it as lower bounds at each estimate, from
    the snapshot (`estimate_start_ranges`)."""
    rows = (
        Job.objects.filter(
            state__in=[JobState.SUCCEEDED, JobState.FAILED],
            finished_at__gte=now - timedelta(days=HISTORY_DAYS),
            started_at__isnull=False,
        )
        .order_by("-finished_at")
        .values(
            "project_id",
            "tenant_id",
            "submitted_by_id",
            "job_type",
            "replicas",
            "gpu_milli_per_replica",
            "started_at",
            "finished_at",
            "max_runtime_s",
        )[:HISTORY_ROWS]
    )
    return RuntimeModel(map(_sample, rows), unbounded_runtime_s=unbounded_runtime_s)


def _sample(row: Mapping[str, Any]) -> Finished:
    ran: timedelta = row["finished_at"] - row["started_at"]
    return Finished(job_groups(row), ran.total_seconds(), row["max_runtime_s"] or None)


def refresh_estimates(
    snapshot: Snapshot,
    rows: Mapping[int, Mapping[str, Any]],
    profile: Profile,
    model: RuntimeModel,
    config: EtaSettings,
    *,
    monotonic: Callable[[], float] = time.monotonic,
    fence: Callable[[], None] = lambda: None,
    record: EstimateLog | None = None,
    arrivals: ExpectedRanges | Sequence[ExpectedArrival] = (),
    arrival_groups: Mapping[str, Groups] | None = None,
) -> Refreshed:
    """Steps 2-4 of the module docstring on a snapshot built by `build_snapshot` (`rows`:
    its `Built.jobs`). `monotonic` measures the budget (tests pass a fake one); `fence` is
    called inside the writing transaction (the daemon's `Lease.fence`); `record`, the
    estimator's own record (`sim.calibration`), keeps the replay's ranges and corrects
    them (the caller settles it with the starts since its last refresh). `arrivals`: the
    jobs expected meanwhile (`scheduler.estimates.arrivals`; a sequence: the same in both
    replays), `arrival_groups` the groups of the jobs they are like."""
    if not isinstance(arrivals, ExpectedRanges):
        arrivals = ExpectedRanges(tuple(arrivals), tuple(arrivals))
    groups = {core_job_id(key): job_groups(row) for key, row in rows.items()}
    groups = {**(arrival_groups or {}), **groups}
    deadline = monotonic() + config.budget_s
    # 2. order and positions, 3. estimates of the head of the queue, on a budget
    found = estimate_queue(
        as_planned(snapshot, rows),
        profile,
        model,
        groups,
        max_jobs=config.max_jobs,
        stop=lambda: monotonic() >= deadline,
        arrivals=arrivals.p50,
        arrivals_p90=arrivals.p90,
    )
    ranges = found.ranges
    if record is not None:  # 3b. corrected by the record of past estimates
        record.record(snapshot.now, ranges, groups)
        adjust, waiting = record.calibration.adjust, record.waiting_scores(snapshot.now)
        ranges = {
            job: adjust(groups.get(job, ()), snapshot.now, *r, waiting) for job, r in ranges.items()
        }
    # 4. store
    _store(found.positions, ranges, _dt(snapshot.now) or datetime.now(tz=UTC), fence)
    return Refreshed(len(found.positions), len(found.ranges), found.stopped, found.capped)


def settle_record(record: EstimateLog, waiting: Iterable[str]) -> int:
    """Turn the recorded estimates of jobs no longer `waiting` (core ids) into pairs: those
    that started, each estimate with the first admission (an allocation's start) at or
    after it, so that a job preempted and requeued is judged on the start that ended each
    wait; the others (cancelled, or started and requeued before this read) are forgotten.
    Returns the pairs made."""
    still = set(waiting)
    gone = [job for job in record.waiting if job not in still]
    if not gone:
        return 0
    rows = (
        Allocation.objects.filter(job_id__any=[job_pk(job) for job in gone])
        .values_list("job_id", "started_at")
        .distinct()
    )
    starts: dict[str, list[float]] = {}
    for pk, started_at in rows:
        starts.setdefault(core_job_id(pk), []).append(started_at.timestamp())
    record.forget(job for job in gone if job not in starts)
    return record.settle({job: sorted(at) for job, at in starts.items()})


def _store(
    positions: Mapping[str, tuple[int, int]],
    settled: Mapping[str, tuple[float | None, float | None]],
    now: datetime,
    fence: Callable[[], None],
) -> None:
    ids = [int(key) for key in positions]
    with transaction.atomic():
        JobQueueEstimate.objects.exclude(job_id__any=ids).delete()
        kept = {
            e.job_id: e
            for e in JobQueueEstimate.objects.filter(job_id__any=ids).only(
                "job_id", "eta_p50", "eta_p90", "estimated_at"
            )
        }
        made = []
        for key, (in_tenant, in_cluster) in positions.items():
            row = JobQueueEstimate(
                job_id=int(key),
                position_tenant=in_tenant,
                position_cluster=in_cluster,
                computed_at=now,
            )
            if key in settled:
                row.eta_p50, row.eta_p90 = map(_dt, settled[key])
                row.estimated_at = now
            elif int(key) in kept:  # out of budget or beyond the cap: the last estimate stays
                old = kept[int(key)]
                row.eta_p50, row.eta_p90, row.estimated_at = (
                    old.eta_p50,
                    old.eta_p90,
                    old.estimated_at,
                )
            made.append(row)
        JobQueueEstimate.objects.bulk_create(
            made,
            batch_size=1000,
            update_conflicts=True,
            unique_fields=["job"],
            update_fields=[
                "position_tenant",
                "position_cluster",
                "eta_p50",
                "eta_p90",
                "estimated_at",
                "computed_at",
            ],
        )
        # Last, before the commit: a leader that lost the lease must not undo its
        # successor's rows, and the lease row is held (FOR SHARE) only for the commit, so
        # the loop's renewal never waits behind this write.
        fence()


@dataclass(frozen=True)
class _Asked:
    """What one refresh is asked for (`EtaRefresher.after_cycle`'s arguments), its own copy
    of the decayed usage: a refresh in the background must not see the loop change it."""

    now: float
    decayed: dict[str, float]
    max_pending: int
    per_queue: int
    profile: Profile
    fence: Callable[[], None]


@dataclass
class EtaRefresher:
    """The daemon's side: when a refresh is due, and the runtime history it keeps between
    refreshes. Called after each cycle of the leader (`Daemon.cycle`).

    In the loop by default; in a process of its own once `start_background` was called (the
    daemon's loop does so on PostgreSQL, `scheduler.estimates.worker`): then the loop is neither
    held for the refresh's budget nor shares the interpreter with it, the refresh reads and
    writes on the worker's own connection, a refresh still running when the next is due is
    not doubled, and its outcome is logged here when it ends. A worker that died is
    replaced at the next refresh. SQLite serialises writers on its file, so there the
    refresh stays in the loop."""

    config: EtaSettings = field(default_factory=EtaSettings.from_settings)
    monotonic: Callable[[], float] = time.monotonic
    # Seconds of the daemon's clock between reads of the runtime history (bench.eta shortens
    # it for a trace whose jobs last seconds).
    history_every_s: float = HISTORY_EVERY_S
    refreshed_at: float = float("-inf")
    model: RuntimeModel | None = None
    model_at: float = float("-inf")
    # The estimator's own record (`sim.calibration`), kept between refreshes as the
    # history is; its scale is the refresh period (an estimate is no finer than that).
    record: EstimateLog | None = None
    last: Refreshed | None = None
    _pool: ProcessPoolExecutor | None = None
    _running: Future[tuple[Refreshed | None, str]] | None = None
    _ready: Future[int] | None = None

    def after_cycle(
        self,
        *,
        now: float,
        decayed: Mapping[str, float],
        max_pending: int,
        per_queue: int,
        profile: Profile,
        fence: Callable[[], None],
    ) -> Refreshed | None:
        """Refresh when GANTRY_ETA_EVERY_S passed on the daemon's clock (`now`), over the
        queue window the daemon sees (`max_pending`, `per_queue`). In the loop, a database
        error or a lost lease (`fence`) goes to the daemon as any other; a bug here is
        logged and scheduling goes on. In the background, returns None at once; the
        refresh's errors are logged there."""
        if now - self.refreshed_at < self.config.every_s:
            return None
        asked = _Asked(now, dict(decayed), max_pending, per_queue, profile, fence)
        if self._pool is not None:
            if self._running is not None and not self._running.done():
                return None  # due again once the one running is done
            self.refreshed_at = now
            self._submit(asked)
            return None
        self.refreshed_at = now
        return self._refresh(asked)

    def _refresh(self, asked: _Asked) -> Refreshed | None:
        try:
            built = build_snapshot(
                asked.now,
                decayed=asked.decayed,
                max_pending=asked.max_pending,
                per_queue=asked.per_queue,
            )
            record = self._record()
            if record is not None:
                settle_record(record, (job.id for job in built.snapshot.pending))
            arrivals, arrival_groups = self._arrivals(asked.now)
            self.last = refresh_estimates(
                built.snapshot,
                built.jobs,
                asked.profile,
                self._model(asked.now),
                self.config,
                monotonic=self.monotonic,
                fence=asked.fence,
                record=record,
                arrivals=arrivals,
                arrival_groups=arrival_groups,
            )
        except (DatabaseError, LeaseLost):
            raise
        except Exception:
            log.exception("queue estimates not refreshed")
            return None
        return self.last

    def _submit(self, asked: _Asked) -> None:
        assert self._pool is not None
        try:
            running = self._pool.submit(eta_worker.refresh, asked)
        except BrokenProcessPool:  # the worker died: another one
            log.warning("queue estimates' worker died: starting another")
            self._pool.shutdown(wait=False)
            self._pool = None
            self.start_background()
            assert self._pool is not None
            running = self._pool.submit(eta_worker.refresh, asked)
        running.add_done_callback(self._finished)
        self._running = running

    def _finished(self, done: Future[tuple[Refreshed | None, str]]) -> None:
        """A background refresh's outcome, logged here (the worker's own log has its bugs)."""
        try:
            refreshed, error = done.result()
        except Exception as died:  # the worker died during the refresh (BrokenProcessPool)
            log.warning("queue estimates not refreshed: %s", died or type(died).__name__)
            return
        if error:
            log.warning("queue estimates not refreshed: %s", error)
        elif refreshed is not None:
            self.last = refreshed

    @property
    def background(self) -> bool:
        return self._pool is not None

    def start_background(self) -> None:
        """Refresh in a process of its own from now on (see the class), spawned now and set
        up on this process's database settings."""
        if self._pool is None:
            self._pool = ProcessPoolExecutor(
                max_workers=1,
                mp_context=multiprocessing.get_context("spawn"),
                initializer=eta_worker.start,
                initargs=(
                    os.getpid(),
                    settings.SETTINGS_MODULE,
                    dict(connection.settings_dict),
                    astuple(self.config),
                    self.history_every_s,
                ),
            )
            # spawned and set up now, not at the first refresh: a worker's start (Django's
            # set-up, seconds on a loaded host) would otherwise delay the first estimates
            self._ready = self._pool.submit(eta_worker.ready)

    def wait_ready(self, timeout_s: float) -> int:
        """Block until the background worker is set up; its pid (the benchmarks start their
        clock with the worker ready)."""
        if self._ready is None:
            raise RuntimeError("no background worker: call start_background first")
        return self._ready.result(timeout_s)

    def close(self) -> None:
        """Wait for a refresh still running (at most its budget and its write) and stop the
        worker; refreshes run in the loop again after this."""
        pool, self._pool, self._running, self._ready = self._pool, None, None, None
        if pool is not None:
            pool.shutdown(wait=True)

    def _record(self) -> EstimateLog | None:
        if self.record is None and self.config.calibrate:
            self.record = EstimateLog(Calibration(floor_s=max(1.0, self.config.every_s)))
        return self.record

    def _arrivals(self, now: float) -> tuple[ExpectedRanges, dict[str, Groups]]:
        if self.config.arrivals_window_s <= 0:
            return ExpectedRanges((), ()), {}
        return arrivals_expected(
            now,
            job_groups,
            window_s=self.config.arrivals_window_s,
            max_count=self.config.arrivals_max,
            late_windows=self.config.arrivals_late_windows,
        )

    def _model(self, now: float) -> RuntimeModel:
        if self.model is None or now - self.model_at >= self.history_every_s:
            at = _dt(now) or datetime.now(tz=UTC)
            self.model = runtime_history(at, self.config.unbounded_runtime_s)
            self.model_at = now
        return self.model
