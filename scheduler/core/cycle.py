"""``run_cycle``: the one entry point of the engine. Snapshot in, decisions out.

Deterministic: no clock (time is ``snapshot.now``), no randomness, and every tie is broken by
a stable key (job id, node order), so the same snapshot and profile give the same result.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field, replace

from scheduler.core import reasons
from scheduler.core.backfill import ends_before_reservation, hold_reservation, reserve
from scheduler.core.context import CycleContext, Held
from scheduler.core.facts import Facts, JobFacts, Mix, Shape
from scheduler.core.nomination import hold_nominated, release, retake
from scheduler.core.order import effective_priority, fair_share, ordered_jobs
from scheduler.core.placement import Placer
from scheduler.core.plans import cause_of, describe, plan_later
from scheduler.core.preemption import (
    QUOTA_SHORT,
    Plan,
    Waiting,
    select_victims,
    work_lost_gpu_s,
    would_preempt,
)
from scheduler.core.profile import Profile
from scheduler.core.quota import QuotaLedger
from scheduler.core.scoring import FragmentationScore, GpuFit, Scorer, TopologyScore
from scheduler.core.tentative import ClusterState
from scheduler.core.types import (
    MILLI_PER_GPU,
    CycleResult,
    JobRequest,
    Placement,
    PlannedPreemption,
    Preemption,
    ReplicaAssignment,
    Reservation,
    RunningJob,
    Snapshot,
    WaitCode,
    WaitReason,
)


@dataclass(slots=True)
class _Decisions:
    placements: list[Placement] = field(default_factory=list)
    preemptions: list[Preemption] = field(default_factory=list)
    reservations: list[Reservation] = field(default_factory=list)
    waiting: list[WaitReason] = field(default_factory=list)
    # Equal requests fail alike within a cycle (kube-scheduler's equivalence cache); cleared
    # whenever capacity is freed (preemption) or re-partitioned (a reservation).
    memo: dict[tuple[int, bool], WaitReason] = field(default_factory=dict)
    # Quota floors: the least milli-GPU a job (team, user, class, flavors...: `_floor_key`)
    # was refused, its quota short on every flavor even with every candidate victim stopped.
    # Usage only grows until a preemption, so a request at least as large fails alike and is
    # told its quota reason without a victim search. Cleared with the memo on a preemption,
    # not on a reservation (quota is not reserved).
    floors: dict[int, int] = field(default_factory=dict)
    # The jobs left waiting for room in this cycle, which hold it against the jobs they
    # could preempt (``hold_for_higher_priority``): the first of each tenant, class and
    # flavors, by tenant (against its own jobs); and those within their guarantee (against
    # borrowers they would reclaim from).
    holding: dict[str, dict[tuple[int, tuple[str, ...]], JobRequest]] = field(default_factory=dict)
    reclaiming: dict[tuple[str, int, tuple[str, ...]], JobRequest] = field(default_factory=dict)

    def result(self) -> CycleResult:
        return CycleResult(
            tuple(self.placements),
            tuple(self.preemptions),
            tuple(self.reservations),
            tuple(self.waiting),
        )


def run_cycle(
    snapshot: Snapshot,
    profile: Profile,
    *,
    on_phase: Callable[[str], None] | None = None,
    held: Held | None = None,
) -> CycleResult:
    """Decide placements, preemptions and reservations for ``snapshot.pending``, and give
    every job left waiting a reason. ``on_phase(name)`` is called as each phase starts (and
    with ``"done"``), so a caller can time phases without the engine reading a clock.
    ``held``: the base kept from the caller's previous cycle (see ``context.Held``); the
    result is the same with or without it."""
    phase = on_phase or (lambda _name: None)
    try:
        phase("snapshot")  # 1. tentative state and ledger from what runs, less the nominated
        ctx = build_context(snapshot, profile, held)
        hold_nominated(ctx, snapshot.nominated)
        phase("order")  # 2. priority, fair share, age
        queue = _queue(ctx)
        phase("schedule")  # 3. admit, place, 4. preempt, 5. backfill: per job, best first
        out = _Decisions()
        for job in queue:
            _schedule(ctx, job, out)
        phase("elastic")  # 6. grow running inference jobs above their min, within quota
        _grow_elastic(ctx, out)
        phase("done")
    except BaseException:
        if held is not None:
            held.drop()
        raise
    if held is not None:  # back to what runs, for the next cycle
        ctx.rollback((0, 0))
        ctx.state.clear_reservations()
    return out.result()


def queue_order(snapshot: Snapshot, profile: Profile) -> tuple[JobRequest, ...]:
    """The pending jobs in the order a cycle on ``snapshot`` would consider them (phase 2),
    as the queue stands: each tenant's fair share is read with nothing admitted yet, so a
    tenant whose head a cycle admits would fall back behind others. Jobs still holding
    devices (live) are not in the queue. For queue positions shown to people."""
    return tuple(_queue(build_context(snapshot, profile)))


def build_context(snapshot: Snapshot, profile: Profile, held: Held | None = None) -> CycleContext:
    """State and ledger holding every running allocation, and the placer with its plugins.
    With ``held``: its state and ledger, brought from what ran at its last cycle to what
    runs now (or built afresh when the nodes, tenants, classes or profile changed)."""
    key = (snapshot.nodes, snapshot.tenants, snapshot.priority_classes, profile)
    now = {running.job.id: running for running in snapshot.running}
    if held is not None and len(now) != len(snapshot.running):  # a job twice: no base follows
        held.drop()
        held = None
    if held is None or held.key != key or held.state is None or held.ledger is None:
        state = ClusterState(snapshot.nodes, profile.cpu_only_share)
        flavors = set(state.flavor_names) | {f for t in snapshot.tenants for f in t.quotas}
        ledger = QuotaLedger(snapshot.tenants, sorted(flavors))
        before: dict[str, RunningJob] = {}
        facts, mix = Facts(), Mix()
    else:
        state, ledger, before = held.state, held.ledger, held.running
        facts, mix = held.facts, held.mix
    placer = Placer(
        state, lambda: _scorers(profile, state, mix.of(snapshot.pending)), profile.max_scored_nodes
    )
    classes = {pc.name: pc for pc in snapshot.priority_classes}
    ctx = CycleContext(snapshot, profile, state, ledger, placer, classes, facts)
    if ledger.pinned:
        placer.narrow = ctx.pinned_mask
    # Unchanged is mostly the very same object (the daemon's cache keeps them): `is` first.
    # A job whose pods started since holds what it held: its hold is not given back and
    # taken again.
    for job_id, running in before.items():  # ended or changed since
        if (other := now.get(job_id)) is not running and not _holds_alike(other, running):
            ctx.hold(running.job, running.flavor, running.assignments, -1)
            mix.run(running.job, -1)
    for running in snapshot.running:  # started or changed since
        if (other := before.get(running.job.id)) is not running and not _holds_alike(
            other, running
        ):
            ctx.hold(running.job, running.flavor, running.assignments, +1)
            mix.run(running.job, +1)
        ctx.set_live(running)
        ctx.guarded.update(running.displaced)
        if running.leaving and ctx.counts_against_quota(running.job):
            for node in ledger.chain.get(running.job.tenant, ()):
                where = (node, running.flavor)
                ctx.leaving[where] = ctx.leaving.get(where, 0) + running.gpu_milli
    if held is not None:
        state.commit()
        ledger.commit()
        held.key, held.state, held.ledger, held.running = key, state, ledger, now
        held.facts, held.mix = facts, mix
    return ctx


def _holds_alike(other: RunningJob | None, running: RunningJob) -> bool:
    """Whether ``other`` holds on state and ledger exactly what ``running`` does: the same
    job, flavor and assignments (whether and when its pods started aside)."""
    return (
        other is not None
        and other.flavor == running.flavor
        and (other.assignments is running.assignments or other.assignments == running.assignments)
        and (other.job is running.job or other.job == running.job)
    )


def _scorers(
    profile: Profile, state: ClusterState, mix: Counter[Shape]
) -> list[tuple[Scorer, float]]:
    out: list[tuple[Scorer, float]] = []
    for name in sorted(profile.score_weights):
        weight = profile.score_weights[name]
        if weight <= 0:
            continue
        if name == "GpuFit":
            out.append((GpuFit(), weight))
        elif name == "TopologyScore":
            out.append((TopologyScore(), weight))
        else:
            step = profile.fragmentation_step_milli
            out.append((FragmentationScore(state, sorted(mix.items(), key=_mix_key), step), weight))
    return out


def _mix_key(item: tuple[tuple[object, tuple[str, ...]], int]) -> tuple[str, ...]:
    (resources, flavors), _ = item
    return (repr(resources), *flavors)


def _queue(ctx: CycleContext) -> Iterator[JobRequest]:
    """Jobs best first, lazily: each tenant's share is re-read after its job was handled."""
    jobs = [j for j in ctx.snapshot.pending if j.id not in ctx.live]
    ctx.facts.keep(jobs)
    decayed = ctx.snapshot.decayed_usage
    tenants = ctx.ledger.tenants
    profile, now = ctx.profile, ctx.now
    all_flavors = set(ctx.state.flavor_names)

    shares: dict[str, tuple[int, float]] = {}  # tenant -> (ledger version, share)
    # tenant -> its total guarantee and, per flavor, the key of its usage and the divisor
    # of its share of that flavor (its guarantee, at least one GPU): the same all cycle
    dominant: dict[str, tuple[int, list[tuple[tuple[str, str], int]]]] = {}

    def share(tenant: str) -> float:
        t = tenants.get(tenant)
        if t is None:
            return 0.0
        kept = shares.get(tenant)
        if kept is not None and kept[0] == ctx.ledger.changes:
            return kept[1]
        fixed = dominant.get(tenant)
        if fixed is None:
            flavors = all_flavors | set(t.quotas)
            guarantees = {f: ctx.ledger.guarantee(tenant, f) for f in flavors}
            fixed = dominant[tenant] = (
                sum(guarantees.values()),
                [((tenant, f), max(g, MILLI_PER_GPU)) for f, g in guarantees.items()],
            )
        total_g, divisors = fixed
        used = ctx.ledger.usage
        current = max((used.get(key, 0) / divisor for key, divisor in divisors), default=0.0)
        value = fair_share(current, decayed.get(tenant, 0.0), total_g, t.weight, profile)
        shares[tenant] = (ctx.ledger.changes, value)
        return value

    def priority(job: JobRequest) -> float:
        return effective_priority(job, ctx.classes, now, profile)

    def borrows(job: JobRequest) -> bool:
        """Whether admitting the job now would borrow on every flavor it may use."""
        if not profile.guaranteed_first or job.tenant not in tenants:
            return False
        facts = ctx.facts.of(ctx, job)
        return ctx.ledger.borrows_on_all(job.tenant, facts.flavors, facts.milli)

    return ordered_jobs(jobs, priority, share, borrows)


def _schedule(ctx: CycleContext, job: JobRequest, out: _Decisions) -> None:
    """Admit and place one job, preempting or reserving as needed; or record its reason."""
    retaken = retake(ctx, job)  # its victims still stop: the same plan, not a new search
    if retaken is not None:
        _record_preemption(ctx, out, job, *retaken)
        return
    nominated = release(ctx, job)  # the room held for it is free again, for it first
    if nominated:
        out.memo.clear()
        out.floors.clear()
    facts = ctx.facts.of(ctx, job)
    if facts.invalid:
        out.waiting.append(reasons.invalid(job, facts.invalid))
        return
    if job.not_before > ctx.now:
        out.waiting.append(reasons.backoff(job, ctx.now))
        return
    if not nominated and (ahead := _held_for(ctx, job, facts, out)) is not None:
        out.waiting.append(reasons.behind(job, ahead))
        return
    # A job the ping-pong guard makes its own shares no memo and no floor.
    guarded = job.id in ctx.guarded
    key = None if guarded else (facts.request, ends_before_reservation(ctx, job))
    cached = out.memo.get(key) if key is not None else None
    if cached is not None:
        out.waiting.append(replace(cached, job_id=job.id))
        _hold(ctx, job, facts, cached, out)
        return
    reservations_before = len(out.reservations)
    reason = _admit_and_place(ctx, job, facts, _floor_key(facts, guarded), out)
    if reason is not None:
        out.waiting.append(reason)
        _hold(ctx, job, facts, reason, out)
        if key is not None and len(out.reservations) == reservations_before:
            out.memo[key] = reason


# The reasons of a job that waits for room, which it holds against the jobs it could preempt
# there (``hold_for_higher_priority``): quota, or devices.
WAITS_FOR_ROOM = frozenset(
    {
        WaitCode.QUOTA,
        WaitCode.CAPACITY,
        WaitCode.FRAGMENTATION,
        WaitCode.GPU_MEMORY,
        WaitCode.RESERVATION,
    }
)


def _hold(
    ctx: CycleContext, job: JobRequest, facts: JobFacts, reason: WaitReason, out: _Decisions
) -> None:
    """Note ``job``, left waiting for room, as holding it against the jobs later in the cycle
    it could preempt (the first of its tenant, class and flavors), on the flavors whose room
    is its tenant's to give it: where it fits in its tenant's guarantee. A gang larger than
    its tenant's guarantee needs what other tenants lend, which may not come for long: it
    holds nothing, and keeps no job of its tenant from room it could not have."""
    if not (ctx.profile.hold_for_higher_priority and reason.code in WAITS_FOR_ROOM):
        return
    ledger = ctx.ledger
    guaranteed = tuple(f for f in facts.flavors if facts.milli <= ledger.guarantee(job.tenant, f))
    if not guaranteed:
        return
    value = ctx.priority_class(job).value
    out.holding.setdefault(job.tenant, {}).setdefault((value, guaranteed), job)
    owed = tuple(f for f in guaranteed if ledger.within_guarantee_after(job.tenant, f, facts.milli))
    if owed:
        out.reclaiming.setdefault((job.tenant, value, owed), job)


def _held_for(
    ctx: CycleContext, job: JobRequest, facts: JobFacts, out: _Decisions
) -> JobRequest | None:
    """A job left waiting for room that ``job`` would take on every flavor it may use, and
    that could preempt it there (by priority in their tenant, or by a reclaim): started now,
    ``job`` would only be preempted for it once it fits. None when there is none."""
    own = out.holding.get(job.tenant)
    if not (own or out.reclaiming) or not facts.flavors:
        return None
    holder = None
    for flavor in facts.flavors:
        holder = next(
            (h for (_, theirs), h in (own or {}).items()
             if flavor in theirs and would_preempt(ctx, h, job, flavor)),
            None,
        )  # fmt: skip
        if holder is None and not ctx.ledger.within_guarantee_after(
            job.tenant, flavor, facts.milli
        ):
            holder = next(  # it would borrow: a reclaim's to take back
                (h for (tenant, _, theirs), h in out.reclaiming.items()
                 if tenant != job.tenant and flavor in theirs
                 and would_preempt(ctx, h, job, flavor)),
                None,
            )  # fmt: skip
        if holder is None:
            return None  # a flavor no waiting job holds against it
    return holder


def _floor_key(facts: JobFacts, guarded: bool) -> int | None:
    """The job's key among the quota floors; None: it shares none."""
    return None if guarded else facts.asker


def _admit_and_place(
    ctx: CycleContext, job: JobRequest, facts: JobFacts, floor_key: int | None, out: _Decisions
) -> WaitReason | None:
    """Pass 1: the best node over every allowed flavor whose quota admits the job, without
    preemption; pass 2: flavor by flavor, with preemption; then a reservation when the job
    waits on capacity. None when placed, else why it waits. ``floor_key``: the job's key
    among the quota floors (None: it shares none)."""
    gang = tuple(range(job.gang_size))
    flavors, milli = facts.flavors, facts.milli
    if floor_key is not None and milli >= out.floors.get(floor_key, milli + 1):
        reason, capacity_flavor = _why_waiting(ctx, job, flavors, gang)
        if not capacity_flavor:  # quota short on every flavor, as the floor's job was
            return reason
    found = ctx.try_place_any(
        job, flavors, gang, avoid_reserved=not ends_before_reservation(ctx, job)
    )
    if found is not None:
        _record(ctx, out, job, found[0], found[1], ())
        return None
    reason, capacity_flavor = _why_waiting(ctx, job, flavors, gang)
    short = bool(flavors)
    avoid = not ends_before_reservation(ctx, job)
    planned: PlannedPreemption | None = None
    for flavor in flavors:
        plan = select_victims(ctx, job, flavor, gang, avoid)
        if isinstance(plan, Plan):
            _record_preemption(ctx, out, job, flavor, plan)
            return None
        if isinstance(plan, Waiting) and planned is None:
            planned = describe(job, flavor, plan.at, plan.chosen)
        short = short and plan == QUOTA_SHORT
    if short and floor_key is not None:
        out.floors[floor_key] = min(milli, out.floors.get(floor_key, milli))
    # 4b. No victims now: the preemption planned for when some leave their minimum runtime.
    for flavor in flavors if planned is None else ():
        planned = plan_later(ctx, job, flavor, gang, avoid)
        if planned is not None:
            break
    if planned is not None:
        reason = reasons.planned(reason, planned, ctx.now)
    if capacity_flavor and ctx.profile.backfill and ctx.reservation is None:
        return _reserve(ctx, job, capacity_flavor, gang, out, planned) or reason
    return reason


def _why_waiting(
    ctx: CycleContext, job: JobRequest, flavors: tuple[str, ...], gang: tuple[int, ...]
) -> tuple[WaitReason, str]:
    """The reason, and the first flavor whose quota admits the job and whose nodes could
    hold it ("" if none): capacity on that flavor explains more than quota on another. A job
    no usable node of any allowed flavor could hold is told so, with the closest miss."""
    milli = job.resources.gpu_milli * len(gang)
    misfits = {
        f: ctx.state.misfit(
            job.resources, len(gang), f, job.pools, job.tolerations, job.clusters, job.regions
        )
        for f in flavors
    }
    if flavors and all(misfits.values()):
        return reasons.never_fits(job, [m for m in misfits.values() if m is not None]), ""
    verdicts = [(f, ctx.quota_verdict(job, f, milli)) for f in flavors if misfits[f] is None]
    admitted = [f for f, verdict in verdicts if verdict is None]
    if admitted:
        # Told about the flavor with the most free, which came closest; reserved on the
        # job's first choice.
        told = max(admitted, key=ctx.state.free_milli) if len(admitted) > 1 else admitted[0]
        return _capacity_reason(ctx, job, told), admitted[0]
    for _, verdict in verdicts:
        if verdict is not None:
            return reasons.quota(job, verdict), ""
    return reasons.no_flavor(job), ""


def _capacity_reason(ctx: CycleContext, job: JobRequest, flavor: str) -> WaitReason:
    held = ctx.reservation
    if held is not None and held.flavor == flavor and not ends_before_reservation(ctx, job):
        mark = ctx.mark()
        fits_without = ctx.try_place(job, flavor, tuple(range(job.gang_size)), avoid_reserved=False)
        ctx.rollback(mark)
        if fits_without is not None:
            return reasons.reservation(job, held, ctx.now)
    return reasons.capacity(ctx, job, flavor)


def _reserve(
    ctx: CycleContext,
    job: JobRequest,
    flavor: str,
    gang: tuple[int, ...],
    out: _Decisions,
    planned: PlannedPreemption | None,
) -> WaitReason | None:
    """Reserve devices for the blocked head job. Its reason says what the reservation waits
    for: a planned preemption (``planned``, when it comes no later than the reservation's
    start) is named as such, not as "devices reserved" alone."""
    held = reserve(ctx, job, flavor, gang)
    if held is None:
        return None
    hold_reservation(ctx, held)
    out.reservations.append(held)
    out.memo.clear()
    base = reasons.capacity(ctx, job, flavor)
    if planned is not None and planned.at <= held.start_at:
        told = reasons.planned(base, planned, ctx.now)
        return replace(told, message=f"{told.message}; devices reserved for it")
    minutes = max(0.0, held.start_at - ctx.now) / 60
    return replace(base, message=f"{base.message}; devices reserved, expected in {minutes:.0f} min")


def _record(
    ctx: CycleContext,
    out: _Decisions,
    job: JobRequest,
    flavor: str,
    placed: tuple[ReplicaAssignment, ...],
    victims: tuple[str, ...],
) -> None:
    extras = _place_extras(
        ctx, job, flavor, range(job.gang_size, job.replicas), beside=placed[0].node
    )
    assignments = placed + extras
    # Quota, like devices, is held by this cycle's victims until their pods are gone: a job
    # that fits only on the quota they free waits for them, as its preemptor does (the
    # daemon binds a placement once the jobs it lists have stopped).
    if not victims and ctx.relies_on_stopping(job, flavor, assignments):
        victims = tuple(dict.fromkeys(ctx.victims))
    if victims and ctx.counts_against_quota(job):
        ctx.stopping.append((job, flavor, assignments, -1))  # charged, not running before them
    out.placements.append(Placement(job.id, flavor, assignments, victims=victims))
    ctx.set_live(RunningJob(job, flavor, assignments, ctx.now, displaced=victims))
    ctx.fresh.add(job.id)


def _place_extras(
    ctx: CycleContext,
    job: JobRequest,
    flavor: str,
    replicas: Iterable[int],
    *,
    beside: str,
    held_back: bool = False,
) -> tuple[ReplicaAssignment, ...]:
    """Elastic replicas one by one, within quota, without preemption; stop at the first miss;
    in the cluster of `beside`, a node the job holds (a job runs in one cluster).
    `held_back`: a replica that fits its quota only on what this cycle's victims free is not
    placed (a running job grows a replica at once, with nothing to wait for: it grows when
    they are gone, in a later cycle)."""
    out: list[ReplicaAssignment] = []
    avoid = not ends_before_reservation(ctx, job)
    for replica in replicas:
        mark = ctx.mark()
        placed = ctx.try_place(
            job, flavor, (replica,), avoid_reserved=avoid, elastic=True, beside=beside
        )
        if placed is None:
            break
        if held_back and ctx.relies_on_stopping(job, flavor, placed):
            ctx.rollback(mark)
            break
        out.extend(placed)
    return tuple(out)


def _record_preemption(
    ctx: CycleContext, out: _Decisions, job: JobRequest, flavor: str, plan: Plan
) -> None:
    stopped: list[tuple[RunningJob, tuple[ReplicaAssignment, ...]]] = []
    for victim in plan.victims:
        running = ctx.live[victim.running.job.id]
        left = tuple(a for a in running.assignments if a not in victim.assignments)
        whole = not any(not a.elastic for a in left)
        stopped.append((running, running.assignments if whole else victim.assignments))
        out.preemptions.append(
            Preemption(
                running.job.id,
                job.id,
                tuple(a.replica for a in (running.assignments if whole else victim.assignments)),
                whole,
                _why(ctx, job, victim.running, victim.reclaim, victim.elastic_only),
                work_lost_gpu_s(running, victim.assignments, ctx.now),
                cause_of(victim),
            )
        )
        if whole:
            if left:  # elastic extras cannot outlive their core replicas
                ctx.hold(running.job, running.flavor, left, -1)
            ctx.drop_live(running.job.id)
        else:
            ctx.set_live(replace(running, assignments=left))
            ctx.shrunk.add(running.job.id)
    out.memo.clear()
    out.floors.clear()
    # The victims run, and hold their quota, until their pods are gone (`_record`).
    for running, assignments in stopped:
        ctx.victims.append(running.job.id)
        if ctx.counts_against_quota(running.job):
            ctx.stopping.append((running.job, running.flavor, assignments, +1))
    _record(ctx, out, job, flavor, plan.assignments, tuple(v.running.job.id for v in plan.victims))


def _why(ctx: CycleContext, job: JobRequest, victim: RunningJob, reclaim: bool, extra: bool) -> str:
    if extra:
        return f"elastic replicas of {victim.job.id} give way to job {job.id}"
    if reclaim:
        return f"{job.tenant} reclaims its guarantee from {victim.job.tenant}, which borrows"
    if not ctx.priority_class(victim.job).counts_against_quota:
        return f"best-effort job gives way to job {job.id}"
    return f"job {job.id} of higher priority in {job.tenant}"


def _grow_elastic(ctx: CycleContext, out: _Decisions) -> None:
    """Running inference jobs below their replica count grow, one elastic replica at a time."""
    for running in ctx.snapshot.running:
        job, current = running.job, ctx.live.get(running.job.id)
        if current is None or job.min_replicas is None or job.id in ctx.fresh:
            continue
        if job.id in ctx.shrunk:
            continue
        have = {a.replica for a in current.assignments}
        missing = [r for r in range(job.replicas) if r not in have]
        beside = current.assignments[0].node if current.assignments else None
        if beside is None:
            continue
        grown = _place_extras(ctx, job, current.flavor, missing, beside=beside, held_back=True)
        if grown:
            out.placements.append(Placement(job.id, current.flavor, grown))
            ctx.set_live(replace(current, assignments=current.assignments + grown))
