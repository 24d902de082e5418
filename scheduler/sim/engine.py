"""Discrete-event replay on virtual time, deciding through ``run_cycle``.

Events at one instant are handled in a fixed order (ends, failures, outages, heals,
arrivals, ticks), then one scheduling cycle runs on the resulting snapshot and its decisions
are applied at once: preemptions stop their victims (requeued, attempt raised), placements
start jobs (or grow elastic ones). Pure and deterministic: no clock, no randomness.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace

from scheduler.core import Profile, decay_usage, run_cycle
from scheduler.core.context import Held
from scheduler.core.types import (
    MILLI_PER_GPU,
    CycleResult,
    JobRequest,
    Placement,
    Preemption,
    RunningJob,
    Snapshot,
    WaitCode,
)
from scheduler.sim.measures import (
    JobOutcome,
    Percentiles,
    SimReport,
    jain_index,
    time_average,
    wait_percentiles,
)
from scheduler.sim.workload import Cluster, NodeOutage, SimConfig, WorkloadJob

END, FAIL, OUTAGE, HEAL, ARRIVE, TICK, APPLY = range(7)  # handling order at one instant


@dataclass(frozen=True, slots=True)
class StartState:
    """A replay that starts mid-flight: see ``Simulation``."""

    now: float
    running: tuple[RunningJob, ...]
    ends: Mapping[str, float]
    decayed: Mapping[str, float]


def _submitted(w: WorkloadJob) -> JobRequest:
    at = w.arrival_s if w.submitted_at is None else w.submitted_at
    return replace(w.request, submitted_at=at)


@dataclass(slots=True)
class _Track:
    spec: WorkloadJob
    request: JobRequest
    done_s: float = 0.0  # progress kept across stops (checkpoints)
    first_start: float | None = None
    starts: list[float] = field(default_factory=list)  # every start, requeues included
    end: float | None = None
    state: str = "pending"
    preemptions: int = 0
    gpu_s: float = 0.0
    epoch: int = 0  # bumps on every stop, so stale END/FAIL events are ignored
    reason: str = ""  # the latest cycle's wait reason, while it waits


def simulate(
    workload: Sequence[WorkloadJob],
    cluster: Cluster,
    profile: Profile,
    *,
    outages: Sequence[NodeOutage] = (),
    config: SimConfig | None = None,
) -> SimReport:
    """Replay ``workload`` on ``cluster`` with ``profile`` and report what happened."""
    return Simulation(workload, cluster, profile, outages, config or SimConfig()).run()


class Simulation:
    """One replay. ``start`` seeds it mid-flight (used by ``estimate``): the virtual clock
    starts there, with ``start.running`` jobs already holding their devices until
    ``start.ends[job id]`` and ``start.decayed`` as the tenants' history. ``stop``: see
    ``__init__``; what a stopped replay reports happened before the stop, and is final."""

    def __init__(
        self,
        workload: Sequence[WorkloadJob],
        cluster: Cluster,
        profile: Profile,
        outages: Sequence[NodeOutage],
        config: SimConfig,
        start: StartState | None = None,
        stop: Callable[[], bool] | None = None,
        progress: Callable[[float, int], None] | None = None,
    ) -> None:
        self.cluster, self.profile, self.config = cluster, profile, config
        # Asked before every cycle; True ends the replay there (``stopped``): a caller's time
        # budget, the replay itself reading no clock.
        self.stop, self.stopped = stop, False
        # Told (virtual now, cycles so far) after every cycle; a caller that writes what it
        # hears somewhere throttles itself.
        self.progress = progress
        self.nodes = {n.name: n for n in cluster.nodes}
        self.tracks = {w.request.id: _Track(w, _submitted(w)) for w in workload}
        self.pending: dict[str, JobRequest] = {}
        self.running: dict[str, RunningJob] = {}
        # Milli-GPU each running job holds, kept with `running` (`_run`, `_stop`): the
        # accounting reads it at every event.
        self._milli: dict[str, int] = {}
        self.events: list[tuple[float, int, int, str, int]] = []
        self._seq = 0
        t0 = start.now if start is not None else 0.0
        self.now = self._last_account = self._decayed_at = t0
        self.cycles = 0
        self.held = Held()  # the engine's state of what runs, kept between cycles
        self.decayed: dict[str, float] = dict(start.decayed) if start is not None else {}
        self.tenant_gpu_s: dict[str, float] = {}
        self.borrowed_gpu_s: dict[str, float] = {}  # per tenant, used beyond its guarantee
        self._guaranteed = {
            (t.name, flavor): q.guaranteed
            for t in cluster.tenants
            for flavor, q in t.quotas.items()
        }
        self.fragmented: list[tuple[float, float]] = [(t0, 0.0)]
        self.preemptions = 0
        self.lost_preempt_gpu_s = 0.0
        self.lost_fail_gpu_s = 0.0
        self._charged = {pc.name: pc.counts_against_quota for pc in cluster.priority_classes}
        self._ticks: set[float] = set()
        self._last_cycle_idle = False
        self._decided: dict[str, CycleResult] = {}  # in flight, with cycle_latency_s
        self._busy_until = -math.inf
        if start is not None:
            self._seed(start)
        self.allocation: list[tuple[float, float]] = [(t0, self._allocated_gpus())]
        for w in workload:
            self._push(w.arrival_s, ARRIVE, w.request.id)
        for o in outages:
            self._push(o.at_s, OUTAGE, o.node)
            self._push(o.at_s + o.duration_s, HEAL, o.node)

    def _seed(self, start: StartState) -> None:
        for running in start.running:
            job = running.job
            end = max(start.now, start.ends[job.id])
            spec = WorkloadJob(job, job.submitted_at, end - running.started_at)
            self.tracks[job.id] = _Track(
                spec,
                job,
                first_start=running.started_at,
                starts=[running.started_at],
                state="running",
            )
            self._run(running)
            self._push(end, END, job.id)

    def _push(self, at: float, kind: int, key: str, epoch: int = 0) -> None:
        self._seq += 1
        heapq.heappush(self.events, (round(at, 9), kind, self._seq, key, epoch))

    # -- main loop ------------------------------------------------------------------------

    def run(self) -> SimReport:
        self.replay()
        return self._report()

    def replay(self) -> None:
        """Run the events to the end or the horizon (or until `stop`); `run` reports on
        them, `outcomes` gives each job's alone."""
        horizon = self.config.horizon_s
        while self.events:
            at = self.events[0][0]
            if horizon is not None and at > horizon:
                break
            self._account(at)
            substantive = False  # a tick alone only matters if it was due
            while self.events and self.events[0][0] == at:
                _, kind, _, key, epoch = heapq.heappop(self.events)
                substantive |= self._handle(kind, key, epoch)
            # Ends and outages free GPUs without a cycle to follow when nothing waits: the
            # series must drop then, not at the next placement (or never, after the last end).
            self._note_allocation()
            due = self._due_tick(at)
            # While a cycle is in flight the next one waits for its decisions (APPLY, a
            # substantive event at the end of the cycle, runs it).
            if self.pending and (substantive or due) and self.now >= self._busy_until:
                if self.stop is not None and self.stop():
                    self.stopped = True
                    break
                self._cycle()
            self._schedule_tick()

    def outcomes(self) -> tuple[JobOutcome, ...]:
        """Each job's outcome so far (`SimReport.jobs`), without the report's statistics."""
        return tuple(self._outcome(t) for t in self.tracks.values())

    def _idle(self) -> bool:
        """Nothing runs and only ticks remain: waiting longer cannot change anything."""
        return not self.running and all(e[1] == TICK for e in self.events)

    def _handle(self, kind: int, key: str, epoch: int) -> bool:
        """Apply one event; True when it changed the cluster or the queue."""
        if kind == ARRIVE:
            self.pending[key] = self.tracks[key].request
        elif kind in (END, FAIL):
            track = self.tracks[key]
            if track.epoch != epoch or key not in self.running:
                return False
            if kind == END:
                self._stop(key, keep_all=True)
                track.state, track.end = "succeeded", self.now
            else:
                self._fail(key)
        elif kind in (OUTAGE, HEAL):
            self._node_health(key, healthy=kind == HEAL)
        elif kind == APPLY:
            self._apply(self._decided.pop(key))
        return kind != TICK

    def _due_tick(self, at: float) -> bool:
        due = at in self._ticks
        self._ticks.discard(at)
        return due

    def _schedule_tick(self) -> None:
        if not self.pending:
            return
        waits = [j.not_before for j in self.pending.values() if j.not_before > self.now]
        wake = min([self.now + self.config.tick_s, *waits])
        if wake not in self._ticks and not self._idle_forever():
            self._ticks.add(round(wake, 9))
            self._push(wake, TICK, "")

    def _idle_forever(self) -> bool:
        """No job runs, nothing else will happen and no job waits on a backoff: the queue
        cannot move (e.g. requests no node can ever host)."""
        backoff = any(j.not_before > self.now for j in self.pending.values())
        return self._idle() and not backoff and self._last_cycle_idle

    # -- one cycle ------------------------------------------------------------------------

    def _cycle(self) -> None:
        snapshot = self._snapshot()
        result = run_cycle(snapshot, self.profile, held=self.held)
        self.cycles += 1
        latency = self.config.cycle_latency_s
        if latency > 0:
            self._busy_until = self.now + latency
            key = str(self.cycles)
            self._decided[key] = result
            self._push(self._busy_until, APPLY, key)
        else:
            self._apply(result)
        if self.progress is not None:
            self.progress(self.now, self.cycles)

    def _apply(self, result: CycleResult) -> None:
        for preemption in result.preemptions:
            self._preempt(preemption)
        for placement in result.placements:
            self._start(placement)
        self._last_cycle_idle = not result.placements and not result.preemptions
        for waiting in result.waiting:
            self.tracks[waiting.job_id].reason = waiting.message
        self._note_fragmentation(result)
        self._note_allocation()

    def _snapshot(self) -> Snapshot:
        usage = self._tenant_usage()
        elapsed = self.now - self._decayed_at
        self.decayed = decay_usage(self.decayed, usage, elapsed, self.profile.half_life_s)
        self._decayed_at = self.now
        running = tuple(self._with_checkpoint(r) for r in self.running.values())
        c = self.cluster
        return Snapshot(
            self.now,
            tuple(self.nodes.values()),
            c.tenants,
            c.priority_classes,
            running,
            tuple(self.pending.values()),
            dict(self.decayed),
        )

    def _with_checkpoint(self, running: RunningJob) -> RunningJob:
        if not running.job.checkpointable:
            return running
        return replace(running, last_checkpoint_at=running.started_at + self._kept(running))

    def _kept(self, running: RunningJob) -> float:
        """Seconds of this run's progress a stop keeps (up to the last checkpoint)."""
        if not running.job.checkpointable:
            return 0.0
        interval = self.config.checkpoint_interval_s
        return math.floor((self.now - running.started_at) / interval) * interval

    def _tenant_usage(self) -> dict[str, int]:
        usage: dict[str, int] = {}
        for r in self.running.values():
            usage[r.job.tenant] = usage.get(r.job.tenant, 0) + self._milli[r.job.id]
        return usage

    def _run(self, running: RunningJob) -> None:
        """A job starts running, or runs on with other replicas."""
        self.running[running.job.id] = running
        self._milli[running.job.id] = running.gpu_milli

    # -- applying decisions ---------------------------------------------------------------

    def _start(self, placement: Placement) -> None:
        current = self.running.get(placement.job_id)
        if current is not None:  # an elastic job grows
            grown = current.assignments + placement.assignments
            self._run(replace(current, assignments=grown))
            return
        track = self.tracks[placement.job_id]
        job = self.pending.pop(placement.job_id)
        self._run(
            RunningJob(
                job, placement.flavor, placement.assignments, self.now, displaced=placement.victims
            )
        )
        track.state, track.reason = "running", ""
        track.starts.append(self.now)
        if track.first_start is None:
            track.first_start = self.now
        remaining = max(0.0, track.spec.duration_s - track.done_s)
        if job.attempt < track.spec.failures and track.spec.fail_after_s < remaining:
            self._push(self.now + track.spec.fail_after_s, FAIL, job.id, track.epoch)
        else:
            self._push(self.now + remaining, END, job.id, track.epoch)

    def _preempt(self, preemption: Preemption) -> None:
        running = self.running.get(preemption.job_id)
        if running is None:
            return
        self.preemptions += 1
        if not preemption.whole_job:
            gone = set(preemption.replicas)
            left = tuple(a for a in running.assignments if a.replica not in gone)
            self._run(replace(running, assignments=left))
            return
        self.tracks[preemption.job_id].preemptions += 1
        self.lost_preempt_gpu_s += self._stop(preemption.job_id, keep_all=False)
        self._requeue(preemption.job_id, not_before=self.now)

    def _fail(self, job_id: str) -> None:
        self.lost_fail_gpu_s += self._stop(job_id, keep_all=False)
        track = self.tracks[job_id]
        attempts = track.request.attempt + 1
        if attempts >= self.config.max_attempts:
            track.state, track.end = "failed", self.now
            return
        backoff = min(self.config.retry_max_s, self.config.retry_base_s * 2 ** (attempts - 1))
        self._requeue(job_id, not_before=self.now + backoff)

    def _node_health(self, name: str, *, healthy: bool) -> None:
        node = self.nodes.get(name)
        if node is None:
            return
        self.nodes[name] = replace(node, healthy=healthy)
        if healthy:
            return
        hit = [
            r.job.id for r in self.running.values() if any(a.node == name for a in r.assignments)
        ]
        for job_id in hit:
            self.lost_fail_gpu_s += self._stop(job_id, keep_all=False)
            self._requeue(job_id, not_before=self.now)

    def _stop(self, job_id: str, *, keep_all: bool) -> float:
        """Take the job off the cluster; return the GPU-seconds of work it loses."""
        running = self.running.pop(job_id)
        del self._milli[job_id]
        track = self.tracks[job_id]
        track.epoch += 1
        ran = self.now - running.started_at
        kept = ran if keep_all else self._kept(running)
        track.done_s += kept
        return running.gpu_milli / MILLI_PER_GPU * (ran - kept)

    def _requeue(self, job_id: str, *, not_before: float) -> None:
        track = self.tracks[job_id]
        track.request = replace(
            track.request, attempt=track.request.attempt + 1, not_before=not_before
        )
        track.state = "pending"
        self.pending[job_id] = track.request

    # -- accounting -----------------------------------------------------------------------

    def _account(self, at: float) -> None:
        """Integrate GPU usage per job and tenant up to ``at``, then move the clock."""
        dt = at - self._last_account
        if dt > 0:
            held: dict[tuple[str, str], int] = {}
            for r in self.running.values():
                milli = self._milli[r.job.id]
                gpu_s = milli / MILLI_PER_GPU * dt
                self.tracks[r.job.id].gpu_s += gpu_s
                tenant = r.job.tenant
                self.tenant_gpu_s[tenant] = self.tenant_gpu_s.get(tenant, 0.0) + gpu_s
                if self._counts_quota(r.job.priority_class):
                    key = (tenant, r.flavor)
                    held[key] = held.get(key, 0) + milli
            for (tenant, flavor), milli in held.items():
                beyond = milli - self._guaranteed.get((tenant, flavor), 0)
                if beyond > 0:
                    borrowed = beyond / MILLI_PER_GPU * dt
                    self.borrowed_gpu_s[tenant] = self.borrowed_gpu_s.get(tenant, 0.0) + borrowed
        self._last_account = self.now = at

    def _counts_quota(self, priority_class: str) -> bool:
        """Best-effort classes run on idle capacity outside quota: they borrow nothing."""
        return self._charged.get(priority_class, True)

    def _allocated_gpus(self) -> float:
        return sum(self._milli.values()) / MILLI_PER_GPU

    def _note_allocation(self) -> None:
        value = self._allocated_gpus()
        if value != self.allocation[-1][1]:
            self.allocation.append((self.now, value))

    def _note_fragmentation(self, result: CycleResult) -> None:
        blocked = any(w.code == WaitCode.FRAGMENTATION for w in result.waiting)
        value = self._capacity() - self._allocated_gpus() if blocked else 0.0
        if value != self.fragmented[-1][1]:
            self.fragmented.append((self.now, value))

    def _capacity(self) -> float:
        return float(sum(len(n.devices) for n in self.cluster.nodes))

    # -- report ---------------------------------------------------------------------------

    def _report(self) -> SimReport:
        ends = [t.end for t in self.tracks.values() if t.end is not None]
        makespan = max(ends, default=self.now)
        capacity = self._capacity()
        used = sum(t.gpu_s for t in self.tracks.values())
        jobs = self.outcomes()
        jct = [
            j.end_s - j.arrival_s for j in jobs if j.end_s is not None and j.state == "succeeded"
        ]
        return SimReport(
            makespan_s=makespan,
            capacity_gpus=capacity,
            utilization=used / (capacity * makespan) if capacity and makespan else 0.0,
            allocation=tuple(self.allocation),
            wait_by_tenant=wait_percentiles(jobs, "tenant"),
            wait_by_class=wait_percentiles(jobs, "priority_class"),
            jct=Percentiles.of(jct),
            jain_fairness=jain_index(self.tenant_gpu_s, self._entitlements()),
            fragmented_gpu_pct=100 * time_average(self.fragmented, makespan) / capacity
            if capacity
            else 0.0,
            preemptions=self.preemptions,
            gpu_hours_lost_to_preemption=self.lost_preempt_gpu_s / 3600,
            gpu_hours_lost_to_failures=self.lost_fail_gpu_s / 3600,
            cycles=self.cycles,
            jobs=jobs,
            gpu_hours_by_tenant={t: s / 3600 for t, s in sorted(self.tenant_gpu_s.items())},
            borrowed_gpu_hours={t: s / 3600 for t, s in sorted(self.borrowed_gpu_s.items())},
        )

    def _entitlements(self) -> dict[str, float]:
        return {
            t.name: float(sum(q.guaranteed for q in t.quotas.values()))
            for t in self.cluster.tenants
        }

    def _outcome(self, track: _Track) -> JobOutcome:
        request = track.request
        state = track.state if track.state in ("succeeded", "failed") else "unfinished"
        return JobOutcome(
            request.id,
            request.tenant,
            request.priority_class,
            track.spec.arrival_s,
            track.first_start,
            track.end,
            state,
            request.attempt + 1,
            track.preemptions,
            track.gpu_s,
            track.reason,
            tuple(track.starts),
        )
