"""The scheduler daemon's loop: lead -> sync nodes -> reconcile -> scale -> snapshot -> decide
-> apply -> bind -> commit -> starts -> reasons -> statistics -> samples -> estimates, in small
steps.

One instance leads (the lease in `scheduler.leader`); the others stand by and take over when
the lease expires. Every write is fenced by the lease epoch. `step()` runs one cycle and
returns whether it did work; `run()` waits between steps on LISTEN/NOTIFY (PostgreSQL) or
polling. Time is injectable (`clock`, `sleep`) so tests never wait on the wall clock.

`sync_every_s` spaces the inventory and health sync (every cycle by default; node changes
also arrive by the database flags it reads then); `reasons_every_s` spaces the writes of
waiting jobs' reasons.

Test hooks: `hooks[name]()` is called at "claimed" (after phase A committed), "pods_created",
"bound" and "before_commit" (inside phase C's transaction); raising there simulates a crash.
"leading" is called when this process takes the lease, before it reads anything: run_scheduler's
federation starts the term from the ledger there (`ClusterWatch.on_lead`).
"""

from __future__ import annotations

import contextlib
import functools
import json
import logging
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, replace
from datetime import datetime

from django.conf import settings
from django.db import (
    DatabaseError,
    InterfaceError,
    OperationalError,
    close_old_connections,
    connection,
)

from scheduler.backends.base import BackendError, ClusterBackend, EventClock, PodWatching
from scheduler.core import Profile, run_cycle
from scheduler.core.context import Held
from scheduler.core.types import JobKind, Placement
from scheduler.daemon.apply import apply_decisions, write_reasons
from scheduler.daemon.autoscaling import autoscale
from scheduler.daemon.bind import bind_plan, commit_binds
from scheduler.daemon.cluster import Cluster
from scheduler.daemon.fair_share import FairShare
from scheduler.daemon.lease import LeaseKeeper
from scheduler.daemon.namespaces import prepare_namespaces
from scheduler.daemon.nodes import sync_nodes
from scheduler.daemon.nominations import still_waiting, waiting_placements
from scheduler.daemon.phases import (
    CycleReports,
    CycleStats,
    Phases,
    collector_for_the_loop,
    go_again,
)
from scheduler.daemon.reconcile import (
    Reconciler,
    ReconcileStats,
    Starts,
    record_starts,
    write_starts,
)
from scheduler.daemon.samples import sample_devices
from scheduler.daemon.state import Clock, Every, Limits, NodeMemory
from scheduler.daemon.upkeep import Statistics
from scheduler.daemon.wakeup import Waiter
from scheduler.estimates.refresh import EtaRefresher
from scheduler.leader import Lease, LeaseLost, daemon_sessions
from scheduler.profiles.files import ProfileWatch
from scheduler.snapshot.build import build_snapshot
from scheduler.snapshot.cache import SnapshotCache

log = logging.getLogger("gantry.daemon")


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
        watch_held: bool = False,
    ) -> None:
        self.backend = backend
        self.lease = lease or Lease()
        self.profile_watch = profile_watch  # the profile's file, reloaded when it changes
        self.profile = profile or (profile_watch.profile if profile_watch else Profile())
        self.clock, self.sleep = clock, sleep
        self.time = Clock(clock, sleep)
        self.interval_s = interval_s
        self.max_pending, self.per_queue = max_pending, per_queue
        self.hooks = hooks or {}
        self.on_cycle = on_cycle
        self.limits = Limits.from_settings(bind_attempts, binding_timeout_s, node_lost_grace_s)
        self.fair_share = FairShare()
        self.keeper = LeaseKeeper(self.lease, self.time, self.fair_share.state)
        self.cluster = Cluster(backend, self.keeper)
        self.nodes = NodeMemory()
        # Project namespaces made (or found Gantry's), and those another owner holds.
        self.namespaces: set[str] = set()
        self.foreign_namespaces: set[str] = set()
        self.cache = SnapshotCache()
        self.held = Held()  # the engine's state of what runs, kept between cycles
        self.nominated: tuple[Placement, ...] = ()  # the last cycle's placements that wait
        # The deployed daemon sweeps held objects from watches (`watch_held`: strays.py).
        self.reconciler = Reconciler(self.nodes, self.limits, watch_held=watch_held)
        self.synced = Every(sync_every_s)
        self.reasons = Every(reasons_every_s)
        self.statistics = Statistics()
        self.sampled = Every(sample_every_s or settings.GANTRY_UTILIZATION_SAMPLE_S)
        self.estimates = EtaRefresher()  # queue positions and start estimates
        self.inference_running = True  # until a snapshot says otherwise
        self.cycle_no = 0
        self.errors = 0
        self.stop = threading.Event()
        self.report = CycleReports(self.lease, self.time)
        self.last: CycleStats | None = None

    @property
    def decayed(self) -> dict[str, float]:
        return self.fair_share.decayed

    def now_dt(self) -> datetime:
        return self.time.dt()

    def hook(self, name: str) -> None:
        if name in self.hooks:
            self.hooks[name]()

    def sync_nodes(self, *, force: bool = False) -> int:
        """The inventory and node health, now (benchmarks and tests call it before the
        first cycle)."""
        return sync_nodes(self.cluster, self.lease, self.nodes, self.time, force=force)

    def reconcile(self) -> ReconcileStats:
        """Reconcile now: the cycle's first phase after the node sync."""
        return self.reconciler.run(self.cluster, self.lease, self.cache, self.time)

    # --- the loop ---------------------------------------------------------------------------

    def step(self) -> bool:
        """Lead (or try to) and run one cycle. True when the next cycle may decide something
        this one could not (`go_again`), so the caller may go again at once; False otherwise,
        then the caller waits for the next event (`run`). Database, lease and backend errors
        are logged and end the step; after a database error leadership is dropped and
        re-taken with a new epoch."""
        try:
            if not self.lease.leading:
                if not self.lease.acquire():
                    return False
                log.info("leading as %s with epoch %s", self.lease.holder, self.lease.epoch)
                self.keeper.mark_renewed()
                self.hook("leading")
                self.cache = SnapshotCache()  # nothing read under another leader is kept
                self.held = Held()
                self.nominated = ()
                self.fair_share.inherit(self.lease.inherited)
                self.sync_nodes(force=True)
            # A few times per TTL, not every cycle: a lost lease is also caught by the fence
            # of the cycle's first write, before anything is written.
            elif self.keeper.renew_due() and not self.keeper.renew_at_step():
                log.warning("lease lost; standing by")
                return False
            stats = self.cycle()
            self.errors = 0
            self.report(None)
            return go_again(stats)
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
        that watches its pods wakes the loop when they change."""
        if waiter is None:
            wake = None
            if isinstance(self.backend, PodWatching):
                wake = self.backend.watch_pods(self.stop)
            waiter = Waiter(self.stop, wake=wake)
        with self.running():
            self._loop(waiter)

    @contextlib.contextmanager
    def running(self) -> Iterator[None]:
        """What surrounds the loop's cycles, for `run` and for a caller driving `step` itself
        (the benchmarks): the estimates in a worker process of their own on PostgreSQL (see
        EtaRefresher), the loop's collector settings and the daemon's session settings."""
        if connection.vendor == "postgresql":
            self.estimates.start_background()
        try:
            with collector_for_the_loop(), daemon_sessions():
                yield
        finally:
            self.estimates.close()  # idempotent: the loop closes it before the lease goes

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
            self.estimates.close()  # a refresh in flight writes under the lease or not at all
            if isinstance(self.backend, PodWatching):
                self.backend.close_watches()
            self.reconciler.close()
            self.cluster.calls.close()
            with contextlib.suppress(DatabaseError):
                self.lease.release()
            log.info("scheduler stopped after %s cycles", self.cycle_no)

    def _timeout(self) -> float:
        if not self.lease.leading:
            return max(0.2, self.lease.ttl_s / 3)
        timeout = self.interval_s
        at = self.backend.next_event_at() if isinstance(self.backend, EventClock) else None
        if at is not None:
            timeout = min(timeout, max(0.0, at - self.clock()) + 0.002)
        return timeout

    # --- one cycle --------------------------------------------------------------------------

    def cycle(self) -> CycleStats:
        self.cycle_no += 1
        if self.profile_watch is not None:  # a changed file counts from this cycle on
            self.profile = self.profile_watch.refresh(lead=self.lease.epoch)
        stats = CycleStats(self.cycle_no, self.lease.epoch)
        phase = Phases(stats)
        with phase("sync"):
            if self.synced.due(self.clock()):
                self.sync_nodes()
                prepare_namespaces(self.cluster, self.namespaces, self.foreign_namespaces)
        with phase("reconcile"):
            rec = self.reconcile()
            stats.reconciled, stats.released, stats.orphans = rec.changed, rec.released, rec.orphans
        with phase("scale"):
            # Scaling rewrites job rows: then the snapshot reads them again.
            scaled = self.inference_running and autoscale(self.backend, self.lease) > 0
        with phase("snapshot"):
            built = build_snapshot(
                self.clock(),
                decayed=self.fair_share.decay(self.clock(), self.profile.half_life_s),
                max_pending=self.max_pending,
                per_queue=self.per_queue,
                cache=self.cache,
                active=rec.active,
                running_rows=None if scaled else rec.rows,
            )
            self.fair_share.record(built.snapshot)
            # Scaling reads the running inference jobs: skipped while the snapshot has none.
            self.inference_running = any(
                r.job.kind is JobKind.INFERENCE for r in built.snapshot.running
            )
            stats.considered = len(built.pending_ids)
        with phase("decide"):
            nominated = still_waiting(self.nominated, built)
            snapshot = replace(built.snapshot, nominated=nominated)
            result = run_cycle(snapshot, self.profile, held=self.held)
        self.keeper.keep()  # a long decide must not let the lease lapse under our writes
        with phase("apply"):
            plan = apply_decisions(
                built,
                result,
                lease=self.lease,
                cache=self.cache,
                now=self.now_dt(),
                reasons_due=self.reasons.due(self.clock()),
            )
            stats.placed, stats.preempted = len(plan.claimed), plan.preempted
            # Their room is held for them next cycle: no victim is re-admitted into it.
            self.nominated = waiting_placements(result, built.pending_ids, plan.claimed)
            free = self.held.free_milli()  # what runs leaves, less what this cycle took
            stats.gpu_left = None if free is None else max(0, free - plan.taken_milli())
        self.hook("claimed")
        with phase("bind"):
            self.keeper.keep()
            outcome = bind_plan(self.cluster, plan, self.hook, self.limits.call_deadline_s)
        with phase("commit"):
            self.keeper.keep()
            recorded: list[Starts] = []  # the starts, in the commit's transaction if it has one
            commit_binds(
                plan,
                outcome,
                cluster=self.cluster,
                lease=self.lease,
                cache=self.cache,
                limits=self.limits,
                now=self.now_dt(),
                hook=self.hook,
                within=lambda: recorded.append(record_starts(rec)),
            )
            stats.pods_bound = sum(len(v) for v in outcome.bound.values())
            stats.bind_failed = len(outcome.failed)
        # Every phase that writes renews first if a third of the TTL has passed: the lease
        # must not lapse under the cycle's last writes either.
        with phase("starts"):  # after the binds, which it must not delay
            self.keeper.keep()
            stats.started = write_starts(rec, self.lease, self.cache, *recorded)
        with phase("reasons"):
            self.keeper.keep()
            write_reasons(plan, self.lease, self.cache)
        with phase("statistics"):  # after the binds, which it must not delay
            self.keeper.keep()
            self.statistics.refresh(self.clock())
        with phase("samples"):  # likewise; once per sampling interval
            if self.sampled.due(self.clock()):
                self.keeper.keep()
                sample_devices(self.backend, self.lease, self.now_dt())
        with phase("estimates"):  # its own wall-time budget, every GANTRY_ETA_EVERY_S
            self.keeper.keep()
            self.estimates.after_cycle(
                now=self.clock(),
                decayed=self.fair_share.decayed,
                max_pending=self.max_pending,
                per_queue=self.per_queue,
                profile=self.profile,
                fence=functools.partial(self.lease.fence, forget=not self.estimates.background),
            )
        self.last = stats
        log.info("cycle %s", json.dumps(asdict(stats), separators=(",", ":")))
        if self.on_cycle is not None:
            self.on_cycle(self)
        return stats
