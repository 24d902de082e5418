"""The scheduler daemon: lead -> sync nodes -> reconcile -> scale -> snapshot -> decide ->
apply -> bind -> commit -> starts -> reasons -> statistics -> estimates, in a loop of small
steps.

One instance leads (the lease in `leader`); the others stand by and take over when the
lease expires. Every write is fenced by the lease epoch. The loop is driven by `step()`,
which returns whether it did work; `run()` waits between steps on LISTEN/NOTIFY (PostgreSQL)
or polling. Time is injectable (`clock`, `sleep`) so tests never wait on the wall clock.

`sync_every_s` spaces the inventory and health sync (every cycle by default; node changes
also arrive by the database flags it reads then); `reasons_every_s` spaces the writes of
waiting jobs' reasons (1 s).

Test hooks: `hooks[name]()` is called at "claimed" (after phase A committed), "pods_created",
"bound" and "before_commit" (inside phase C's transaction); raising there simulates a crash.
"""

from __future__ import annotations

import contextlib
import gc
import json
import logging
import math
import random
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from typing import Any

from django.conf import settings
from django.db import (
    DatabaseError,
    InterfaceError,
    OperationalError,
    close_old_connections,
    connection,
)

from scheduler.adapters import SnapshotCache, build_snapshot
from scheduler.backends.base import BackendError, ClusterBackend
from scheduler.core import Profile, decay_usage, run_cycle
from scheduler.core.context import Held
from scheduler.core.types import JobKind
from scheduler.daemon_apply import apply_decisions, bind_plan, commit_binds, write_reasons
from scheduler.daemon_health import autoscale, refresh_statistics, sync_nodes
from scheduler.daemon_reconcile import reconcile, write_starts
from scheduler.daemon_samples import sample_devices
from scheduler.daemon_wakeup import Waiter
from scheduler.eta import EtaRefresher
from scheduler.leader import Lease, LeaseLost, daemon_sessions
from scheduler.profiles import ProfileWatch

log = logging.getLogger("gantry.daemon")
# Seconds of the daemon's clock between two reports of completed cycles (`Daemon.report`).
REPORT_EVERY_S = 5.0


@dataclass
class CycleStats:
    cycle: int
    epoch: int | None
    considered: int = 0
    placed: int = 0
    pods_bound: int = 0
    bind_failed: int = 0
    preempted: int = 0
    reconciled: int = 0
    released: int = 0
    orphans: int = 0
    phases_ms: dict[str, float] = field(default_factory=dict)


class Daemon:
    def __init__(
        self,
        backend: ClusterBackend,
        *,
        lease: Lease | None = None,
        profile: Profile | None = None,
        profile_watch: ProfileWatch | None = None,
        clock: Callable[[], float] = time.time,
        sleep: Callable[[float], None] = time.sleep,
        interval_s: float = 2.0,
        max_pending: int = 20_000,
        per_queue: int = 0,
        hooks: dict[str, Callable[[], None]] | None = None,
        on_cycle: Callable[[Daemon], None] | None = None,
        sync_every_s: float = 0.0,
        reasons_every_s: float = 1.0,
        bind_attempts: int | None = None,
        binding_timeout_s: float | None = None,
        node_lost_grace_s: float | None = None,
        sample_every_s: float | None = None,
    ) -> None:
        self.backend = backend
        self.bind_attempts = bind_attempts or settings.GANTRY_BIND_ATTEMPTS
        self.binding_timeout_s = binding_timeout_s or settings.GANTRY_BINDING_TIMEOUT_S
        self.node_lost_grace_s = (
            settings.GANTRY_NODE_LOST_GRACE_S if node_lost_grace_s is None else node_lost_grace_s
        )
        # node name -> when (daemon clock) reconcile first saw it NotReady or gone
        self.nodes_down: dict[str, float] = {}
        self.lease = lease or Lease()
        self.profile_watch = profile_watch  # the profile's file, reloaded when it changes
        self.profile = profile or (profile_watch.profile if profile_watch else Profile())
        self.clock, self.sleep = clock, sleep
        self.interval_s = interval_s
        self.max_pending, self.per_queue = max_pending, per_queue
        self.hooks = hooks or {}
        self.on_cycle = on_cycle
        self.random = random.Random().random  # noqa: S311 - jitter
        self.backend_retries, self.backend_backoff_s = 4, 0.05
        self.cycle_no = 0
        self.node_prints: dict[str, Any] = {}
        self.cluster_cordons: set[str] = set()  # nodes this daemon cordoned in the cluster
        self.decayed: dict[str, float] = {}
        self._usage: dict[str, int] = {}
        self._usage_at: float | None = None
        self.errors = 0
        self.sync_every_s = sync_every_s
        self.reasons_every_s = reasons_every_s
        self._reasons_at = -math.inf
        self.requeue_swept_at = -math.inf
        self._synced_at = -math.inf
        self.statistics_at = -math.inf
        # table -> (changes counted, rows) when this daemon last analysed it
        self.analysed: dict[str, tuple[int, int]] = {}
        self._renewed = -math.inf
        self._step_renewed = -math.inf
        self.stop = threading.Event()
        self._failing, self._reported_at = False, -math.inf
        self.last: CycleStats | None = None
        self.cache = SnapshotCache()
        self.held = Held()  # the engine's state of what runs, kept between cycles
        self.inference_running = True  # until a snapshot says otherwise
        # Utilization samples of a backend that reads its devices (scheduler/daemon_samples.py).
        self.sample_every_s = sample_every_s or settings.GANTRY_UTILIZATION_SAMPLE_S
        self.sampled_at = -math.inf
        self.estimates = EtaRefresher()  # queue positions and start estimates

    def now_dt(self) -> datetime:
        return datetime.fromtimestamp(self.clock(), tz=UTC)

    def hook(self, name: str) -> None:
        if name in self.hooks:
            self.hooks[name]()

    # --- the loop ---------------------------------------------------------------------------

    def step(self) -> bool:
        """Lead (or try to) and run one cycle. True when the cycle did work, so the caller
        may go again at once. Database, lease and backend errors are logged and end the step;
        after a database error leadership is dropped and re-taken with a new epoch."""
        try:
            if not self.lease.leading:
                if not self.lease.acquire():
                    return False
                log.info("leading as %s with epoch %s", self.lease.holder, self.lease.epoch)
                self._mark_renewed()
                self.cache = SnapshotCache()  # nothing read under another leader is kept
                self.held = Held()
                self._inherit_fair_share(self.lease.inherited)
                sync_nodes(self, force=True)
            elif self._renew_due():
                # A few times per TTL, not every cycle: a lost lease is also caught by the
                # fence of the cycle's first write, before anything is written.
                if not self.lease.renew(self._fair_share_state()):
                    log.warning("lease lost; standing by")
                    return False
                self._mark_renewed()
            stats = self.cycle()
            self.errors = 0
            self.report(None)
            return bool(stats.placed or stats.reconciled or stats.released or stats.preempted)
        except LeaseLost as lost:
            log.warning("lease lost mid-cycle (%s); nothing more was written", lost)
        except (OperationalError, InterfaceError, DatabaseError) as error:
            self.report(f"database error: {error}")
            self._db_error(error)
        except BackendError as error:
            self.errors += 1
            self.report(f"cluster backend failed: {error}")
            log.warning("cluster backend failed (%s); next cycle retries", error)
            self.sleep(min(10.0, 0.1 * 2 ** min(self.errors, 7)))
        return False

    def report(self, error: str | None) -> None:
        """Record how the cycle went in the lease row (`Lease.record_cycle`), for /healthz and
        the platform admins: every failure, and a completed cycle after a failure or once
        every REPORT_EVERY_S of the daemon's clock. A database that is down cannot take the
        report; /healthz then says so itself."""
        now = self.clock()
        if error is None and not self._failing and now - self._reported_at < REPORT_EVERY_S:
            return
        try:
            self.lease.record_cycle(error)
        except DatabaseError:
            return
        self._failing, self._reported_at = error is not None, now

    def _db_error(self, error: Exception) -> None:
        self.errors += 1
        log.warning("database error (%s); dropping leadership and reconnecting", error)
        self.lease.drop()
        with contextlib.suppress(DatabaseError):
            connection.close()
        close_old_connections()
        self.sleep(min(10.0, 0.1 * 2 ** min(self.errors, 7)))

    def run(self, waiter: Waiter | None = None) -> None:
        """Until `stop` is set (SIGTERM): the current cycle always finishes first. A backend
        that watches its pods (`watch_pods`) wakes the loop when they change."""
        watch = getattr(self.backend, "watch_pods", None)
        waiter = waiter or Waiter(self.stop, wake=watch(self.stop) if watch else None)
        with collector_for_the_loop(), daemon_sessions():
            self._loop(waiter)

    def _loop(self, waiter: Waiter) -> None:
        try:
            while not self.stop.is_set():
                try:
                    if self.step():
                        continue
                except Exception as error:  # a bug must not stop scheduling: log, back off, rescan
                    log.exception("cycle %s failed", self.cycle_no)
                    self.report(f"{type(error).__name__}: {error}")
                    self._db_error(RuntimeError("unexpected error"))
                waiter.wait(self._timeout())
        finally:
            waiter.close()
            close_watches = getattr(self.backend, "close_watches", None)
            if close_watches is not None:
                close_watches()
            with contextlib.suppress(DatabaseError):
                self.lease.release()
            log.info("scheduler stopped after %s cycles", self.cycle_no)

    def _timeout(self) -> float:
        if not self.lease.leading:
            return max(0.2, self.lease.ttl_s / 3)
        timeout = self.interval_s
        next_event = getattr(self.backend, "next_event_at", None)
        at = next_event() if next_event is not None else None
        if at is not None:
            timeout = min(timeout, max(0.0, at - self.clock()) + 0.002)
        return timeout

    # --- one cycle --------------------------------------------------------------------------

    def cycle(self) -> CycleStats:
        self.cycle_no += 1
        if self.profile_watch is not None:  # a changed file counts from this cycle on
            self.profile = self.profile_watch.refresh(lead=self.lease.epoch)
        stats = CycleStats(self.cycle_no, self.lease.epoch)
        clock = _Phases(stats)
        with clock("sync"):
            if self.clock() - self._synced_at >= self.sync_every_s:
                sync_nodes(self)
                self._synced_at = self.clock()
        with clock("reconcile"):
            rec = reconcile(self)
            stats.reconciled, stats.released, stats.orphans = rec.changed, rec.released, rec.orphans
        with clock("scale"):
            # Scaling rewrites job rows: then the snapshot reads them again.
            scaled = self.inference_running and autoscale(self) > 0
        with clock("snapshot"):
            built = build_snapshot(
                self.clock(),
                decayed=self._decay(),
                max_pending=self.max_pending,
                per_queue=self.per_queue,
                cache=self.cache,
                active=rec.active,
                running_rows=None if scaled else rec.rows,
            )
            self._record_usage(built.snapshot)
            # Scaling reads the running inference jobs: skipped while the snapshot has none.
            self.inference_running = any(
                r.job.kind is JobKind.INFERENCE for r in built.snapshot.running
            )
            stats.considered = len(built.pending_ids)
        with clock("decide"):
            result = run_cycle(built.snapshot, self.profile, held=self.held)
        self._renew()  # a long decide must not let the lease lapse under our writes
        with clock("apply"):
            plan = apply_decisions(self, built, result)
            stats.placed, stats.preempted = len(plan.claimed), plan.preempted
        self.hook("claimed")
        with clock("bind"):
            self._renew()
            outcome = bind_plan(self, plan)
        with clock("commit"):
            self._renew()
            commit_binds(self, plan, outcome)
            stats.pods_bound = sum(len(v) for v in outcome.bound.values())
            stats.bind_failed = len(outcome.failed)
        with clock("starts"):  # after the binds, which it must not delay
            stats.reconciled += write_starts(self, rec)
        with clock("reasons"):
            write_reasons(self, plan)
        with clock("statistics"):  # after the binds, which it must not delay
            refresh_statistics(self)
        with clock("samples"):  # likewise; once per sampling interval
            sample_devices(self)
        with clock("estimates"):  # its own wall-time budget, every GANTRY_ETA_EVERY_S
            self.estimates.after_cycle(self)
        self.last = stats
        log.info("cycle %s", json.dumps(asdict(stats), separators=(",", ":")))
        if self.on_cycle is not None:
            self.on_cycle(self)
        return stats

    def reasons_due(self) -> bool:
        """Waiting reasons are written at most every `reasons_every_s` (daemon clock): they
        are for people, and rewriting hundreds of them each cycle slows placing."""
        now = self.clock()
        if now - self._reasons_at < self.reasons_every_s:
            return False
        self._reasons_at = now
        return True

    def _mark_renewed(self) -> None:
        """The lease was just taken or renewed: on the monotonic clock (the deadline between
        phases) and on the daemon's (the next renewal at a step's start)."""
        self._renewed = time.monotonic()
        self._step_renewed = self.clock()

    def _renew_due(self) -> bool:
        """Renewal at the start of a step: every sixth of the TTL on the daemon's clock
        (which saves the fair-share history with it), and whenever that clock went back."""
        elapsed = self.clock() - self._step_renewed
        return elapsed >= self.lease.ttl_s / 6 or elapsed < 0

    def _renew(self) -> None:
        """Renew between phases once a third of the TTL has passed (deadlines on the
        monotonic clock; the lease's own times are the database's)."""
        if time.monotonic() - self._renewed < self.lease.ttl_s / 3:
            return
        if not self.lease.renew(self._fair_share_state()):
            raise LeaseLost("lease lost during the cycle")
        self._mark_renewed()

    def fence_cluster_write(self) -> None:
        """Before every write to the cluster (create, bind, delete, cordon): LeaseLost unless
        this daemon still leads. The cluster knows nothing of epochs, so a stale leader's
        write cannot be refused there: it must not be sent. The lease is renewed (a fenced
        UPDATE of its row) unless that was done less than a sixth of the TTL ago on both the
        monotonic and the daemon's clock, so a call that stalled (a hung API request, a
        paused process) is always followed by a check before the next write."""
        window = self.lease.ttl_s / 6
        since = self.clock() - self._step_renewed
        if 0 <= since < window and time.monotonic() - self._renewed < window:
            return
        if not self.lease.renew():
            raise LeaseLost("lease lost before a write to the cluster")
        self._mark_renewed()

    def _fair_share_state(self) -> dict[str, Any] | None:
        if self._usage_at is None:
            return None
        return {"at": self._usage_at, "decayed": self.decayed}

    def _inherit_fair_share(self, state: dict[str, Any]) -> None:
        """Start from the previous leader's decayed usage: a takeover or restart must not
        reset fair share. Its usage since its last save is unknown and counts as none."""
        if not state.get("decayed") or self._usage_at is not None:
            return
        self.decayed = {str(k): float(v) for k, v in state["decayed"].items()}
        self._usage_at, self._usage = float(state["at"]), {}

    def _decay(self) -> dict[str, float]:
        now = self.clock()
        if self._usage_at is not None:
            elapsed = max(0.0, now - self._usage_at)
            self.decayed = decay_usage(self.decayed, self._usage, elapsed, self.profile.half_life_s)
        self._usage_at = now
        return self.decayed

    def _record_usage(self, snapshot: Any) -> None:
        usage: dict[str, int] = {}
        for running in snapshot.running:
            usage[running.job.tenant] = usage.get(running.job.tenant, 0) + running.gpu_milli
        self._usage = usage


# Young collections every this many allocations (Python's default: 700), older ones rarer.
GC_THRESHOLDS = (10_000, 50, 50)


@contextlib.contextmanager
def collector_for_the_loop() -> Iterator[None]:
    """While the daemon's loop runs: what exists before it (modules, settings, the first
    caches) leaves the collector's view (`gc.freeze`), and young collections come every
    10,000 allocations. A cycle makes hundreds of thousands of short-lived objects (rows,
    requests, decisions); with the defaults `bench.daemon_drain` spent 0.49-0.78 s of its
    loop in the collector, full collections of about 65 ms each among them, in the middle
    of cycles, and 0.31-0.42 s with these settings. Both are restored when the loop ends."""
    before = gc.get_threshold()
    gc.freeze()
    gc.set_threshold(*GC_THRESHOLDS)
    try:
        yield
    finally:
        gc.set_threshold(*before)
        gc.unfreeze()


class _Phases:
    """`with phases("name"):` records the phase's wall time in milliseconds."""

    def __init__(self, stats: CycleStats) -> None:
        self.stats = stats

    def __call__(self, name: str) -> _Phase:
        return _Phase(self.stats, name)


class _Phase:
    def __init__(self, stats: CycleStats, name: str) -> None:
        self.stats, self.name = stats, name

    def __enter__(self) -> None:
        self.started = time.perf_counter()

    def __exit__(self, *exc: object) -> None:
        self.stats.phases_ms[self.name] = round((time.perf_counter() - self.started) * 1000, 2)
