"""Phase 4, preempt: free room for a job that does not fit, with the fewest, cheapest victims.

Who may be a victim of job J (tenant T, class C), all on the flavor J tries:

- elastic extras (inference replicas above min) of T, or of a borrowing tenant: first;
- best-effort jobs of anyone (they only ever run on idle capacity);
- jobs of T whose class value is strictly below C's;
- jobs of other tenants that borrow beyond their guarantee, when J's tenant stays within its
  own guarantee after admission (reclaim); only while the victim's tenant still borrows, and
  its branch toward T too (the victim's ancestor just below where the two meet: a team that
  borrows only its own cohort's unused guarantees owes nothing to another cohort's team);
- when J needs its tenant's guarantee pinned to a cluster (``core.pinned``), jobs on that
  cluster of other tenants that use it beyond their own pinned guarantee there (a reclaim);
  only while they still do.

Never a non-preemptible class, never a job inside the profile's minimum runtime (unless C is
critical and the profile lets critical override; a job whose pods have not started has no
work to protect and may give way at once), never a job that preempted J itself, or that
reclaimed from J's tenant, less than ``ping_pong_guard_s`` ago (no ping-pong). The victim set
is the one of least harm (``harm``; docs/engine.md, "The harm rule"): candidates are taken
cheapest first until J fits, each is put back if J still fits without it (kueue's minimal
set), and single victims of less harm are tried instead.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from scheduler.core import pinned
from scheduler.core.context import BEST_EFFORT_GROUP, CycleContext
from scheduler.core.tentative import BoolArray
from scheduler.core.types import (
    MILLI_PER_GPU,
    JobRequest,
    PriorityClass,
    ReplicaAssignment,
    RunningJob,
)


@dataclass(frozen=True, slots=True)
class Candidate:
    running: RunningJob
    assignments: tuple[ReplicaAssignment, ...]
    elastic_only: bool
    reclaim: bool
    rank: tuple[int, int, float, int, float, str]  # tier, value, lost, milli, -start, id
    # The cluster of a reclaim for a pinned guarantee there (``core.pinned``): the victim's
    # tenant gives way while it uses that cluster beyond its own pinned guarantee.
    pinned_cluster: str = ""
    # A reclaim across the tree: the victim's ancestor just below where it meets the
    # preemptor's tenant (``QuotaLedger.branch_toward``); the victim gives way only while that
    # branch borrows too. "": the victim's tenant itself (siblings).
    owed_by: str = ""

    @property
    def tenant(self) -> str:
        return self.running.job.tenant


@dataclass(frozen=True, slots=True)
class Plan:
    victims: tuple[Candidate, ...]
    assignments: tuple[ReplicaAssignment, ...]


def work_lost_gpu_s(
    running: RunningJob, assignments: tuple[ReplicaAssignment, ...], now: float
) -> float:
    """GPU-seconds of progress lost: since start, or since the last checkpoint; none for a
    job whose pods have not started."""
    if not running.started:
        return 0.0
    since = running.started_at
    if running.job.checkpointable and running.last_checkpoint_at is not None:
        since = max(since, running.last_checkpoint_at)
    milli = sum(a.gpu_milli for a in assignments)
    return milli / MILLI_PER_GPU * max(0.0, now - since)


# `select_victims`' failure when the job's quota stays short even with every candidate
# stopped: no search for a request at least as large, of the same team, user and class,
# can succeed on this flavor until quota is freed (a preemption) in the cycle.
QUOTA_SHORT = "quota short"


@dataclass(frozen=True, slots=True)
class Waiting:
    """No victims now: a cheaper set, some of it still inside its minimum runtime, may
    give way at ``at`` (within the profile's ``wait_for_cheaper_s``)."""

    at: float
    victims: tuple[str, ...]
    chosen: tuple[Candidate, ...] = ()  # the victims as candidates, for the reason


def select_victims(
    ctx: CycleContext, job: JobRequest, flavor: str, replicas: tuple[int, ...], avoid_reserved: bool
) -> Plan | Waiting | str | None:
    """Find victims and place ``job`` in their room; on success state and ledger hold the
    job and no longer hold the victims. On failure nothing changed: None, QUOTA_SHORT
    when stopping every candidate would still leave the job's quota short, or Waiting when
    a cheaper set of victims is seconds from eligible (the job waits for it).

    The search runs over the eligible candidates and those that leave their minimum
    runtime within ``wait_for_cheaper_s``; when its plan needs one of the latter, the
    eligible candidates alone are searched too, and their plan is taken now only if it
    does no more harm (``harm``)."""
    listed = listed_candidates(ctx, job, flavor)
    candidates = [c for c, at in listed if at <= ctx.now]
    soon = {id(c): at for c, at in listed if at > ctx.now}
    if not listed:
        short = ctx.quota_verdict(job, flavor, job.resources.gpu_milli * len(replicas))
        if short is not None:  # nothing to stop: quota stays short on either path
            return QUOTA_SHORT
    borrow = {c.tenant: _owed(ctx, c, flavor) for c, _ in listed if c.reclaim}
    if not soon:
        return _best(ctx, job, flavor, replicas, avoid_reserved, candidates, borrow)
    mark = ctx.mark()
    later = _best(ctx, job, flavor, replicas, avoid_reserved, [c for c, _ in listed], borrow)
    if not isinstance(later, Plan):
        return _best(ctx, job, flavor, replicas, avoid_reserved, candidates, borrow)
    waits = [soon[id(v)] for v in later.victims if id(v) in soon]
    if not waits:
        return later
    ctx.rollback(mark)
    now = _best(ctx, job, flavor, replicas, avoid_reserved, candidates, borrow)
    if isinstance(now, Plan):
        if harm(now.victims, borrow) <= harm(later.victims, borrow):
            return now
        ctx.rollback(mark)
    return Waiting(max(waits), tuple(v.running.job.id for v in later.victims), later.victims)


# How many single victims, each doing less harm than the search's set, are tried instead.
SINGLE_TRIALS = 16


def _best(
    ctx: CycleContext,
    job: JobRequest,
    flavor: str,
    replicas: tuple[int, ...],
    avoid_reserved: bool,
    candidates: list[Candidate],
    borrow: dict[str, int],
) -> Plan | str | None:
    """``_search``'s plan, or one victim alone that does less harm and is enough: taking
    the cheapest first can pass over a job that frees the room by itself (one node's
    worth) for two on another node, or take from a tenant down to its guarantee first."""
    mark = ctx.mark()
    plan = _search(ctx, job, flavor, replicas, avoid_reserved, candidates)
    if not isinstance(plan, Plan) or (len(plan.victims) == 1 and not harm(plan.victims, borrow)[0]):
        return plan
    worst = harm(plan.victims, borrow)
    better = sorted((h, i) for i, c in enumerate(candidates) if (h := harm((c,), borrow)) < worst)[
        :SINGLE_TRIALS
    ]
    if not better:
        return plan
    ctx.rollback(mark)
    for _, i in better:
        cand = candidates[i]
        trial = ctx.mark()
        if _take(ctx, cand, flavor) and _fits(ctx, job, flavor, replicas, avoid_reserved):
            placed = ctx.try_place(job, flavor, replicas, avoid_reserved=avoid_reserved)
            assert placed is not None  # _fits just proved it on this very state
            return Plan((cand,), placed)
        ctx.rollback(trial)
    for victim in plan.victims:  # none better: the search's plan, as it left the state
        _release(ctx, victim, -1)
    ctx.hold(job, flavor, plan.assignments, +1)
    return plan


def harm(victims: tuple[Candidate, ...], borrowing: dict[str, int]) -> tuple[float, ...]:
    """How much a victim set costs, compared in order: milli-GPU its tenants fall below
    their guarantees (reclaims only, from each tenant's ``borrowing`` before: a same-tenant
    or best-effort victim's tenant keeps its share), the highest (tier, class value) taken,
    GPU-seconds of work lost, milli-GPU stopped, victims."""
    taken: dict[str, int] = {}
    for v in victims:
        if v.reclaim:
            taken[v.tenant] = taken.get(v.tenant, 0) + sum(a.gpu_milli for a in v.assignments)
    breach = sum(max(0, milli - borrowing.get(t, 0)) for t, milli in taken.items())
    top = max((v.rank[:2] for v in victims), default=(0, 0))
    lost = sum(v.rank[2] for v in victims)
    milli = sum(v.rank[3] for v in victims)
    return (breach, *top, lost, milli, len(victims))


def _search(
    ctx: CycleContext,
    job: JobRequest,
    flavor: str,
    replicas: tuple[int, ...],
    avoid_reserved: bool,
    candidates: list[Candidate],
) -> Plan | str | None:
    """Two paths: only quota is short (the gang fits on the nodes as they are): the cheapest
    victims that make quota fit, without placement trials; otherwise cheapest first until
    the gang fits on the tentative state. Both then put back every victim the job can do
    without (kueue's minimal set)."""
    if _room_now(ctx, job, flavor, replicas, avoid_reserved):
        return _for_quota(ctx, job, flavor, replicas, avoid_reserved, candidates)
    candidates = candidates[: ctx.profile.max_preemption_candidates]
    if not candidates or not may_make_room(ctx, job, flavor, len(replicas), candidates):
        return None
    mark = ctx.mark()
    removed: list[Candidate] = []
    usable = ctx.placer.usable(job, flavor, job.resources.gpu_milli * len(replicas))
    for cand in candidates:
        if not _frees_room(ctx, cand, usable) and _quota_fits(ctx, job, flavor, replicas):
            continue  # it frees nothing the job lacks: a reclaim would spend what it may take
        if _take(ctx, cand, flavor):
            removed.append(cand)
            if _fits(ctx, job, flavor, replicas, avoid_reserved):
                break
    else:
        ctx.rollback(mark)
        return None
    kept = _minimise(ctx, job, flavor, replicas, avoid_reserved, removed)
    placed = ctx.try_place(job, flavor, replicas, avoid_reserved=avoid_reserved)
    assert placed is not None  # _fits just proved it on this very state
    return Plan(tuple(kept), placed)


def _frees_room(ctx: CycleContext, cand: Candidate, usable: BoolArray) -> bool:
    """Whether the candidate holds a node the job could use (its required clusters, pinned
    quotas and filters)."""
    index = ctx.state.index
    return any((i := index.get(a.node)) is not None and usable[i] for a in cand.assignments)


def _quota_fits(ctx: CycleContext, job: JobRequest, flavor: str, replicas: tuple[int, ...]) -> bool:
    return ctx.quota_verdict(job, flavor, job.resources.gpu_milli * len(replicas)) is None


def may_make_room(
    ctx: CycleContext, job: JobRequest, flavor: str, replicas: int, candidates: list[Candidate]
) -> bool:
    """A cheap necessary condition for the search below, on whole-GPU requests: even if
    every candidate stopped, would the nodes of `flavor` have `replicas` slots of the
    job's GPU count? A device counts as freeable when it is whole and free now or a
    candidate holds part of it. Failed searches (taking candidates one by one, each a
    journaled change of the state) were most of a busy cycle's preemption time; False here
    only ever means the search could not have succeeded. Shares and CPU-only jobs: True."""
    if job.resources.gpu_milli < MILLI_PER_GPU:
        return True
    per_replica = job.resources.gpu_milli // MILLI_PER_GPU
    state = ctx.state
    code = state.flavor_names.index(flavor) if flavor in state.flavor_names else -1
    touched: dict[int, set[int]] = {}
    for cand in candidates:
        for a in cand.assignments:
            i = state.index.get(a.node)
            if i is not None and state.flavor[i] == code:
                touched.setdefault(i, set()).update(s.device for s in a.shares)
    whole = state.whole_free
    slots = int((whole[state.flavor == code] // per_replica).sum())
    for i, devices in touched.items():
        extra = sum(
            1 for d in devices if state.usable[i, d] and state.dev_free[i, d] < MILLI_PER_GPU
        )
        slots += (int(whole[i]) + extra) // per_replica - int(whole[i]) // per_replica
        if slots >= replicas:
            return True
    return slots >= replicas


def _room_now(
    ctx: CycleContext, job: JobRequest, flavor: str, replicas: tuple[int, ...], avoid: bool
) -> bool:
    """Whether the whole gang would fit on the nodes as they are, quota aside."""
    if len(replicas) == 1:
        return ctx.placer.fits_one(job, flavor, avoid_reserved=avoid)
    mark = ctx.mark()
    placed = ctx.placer.place_gang(job, flavor, replicas, avoid_reserved=avoid)
    ctx.rollback(mark)
    return placed is not None


def _take(ctx: CycleContext, cand: Candidate, flavor: str) -> bool:
    """Stop the candidate unless it is a reclaim whose tenant no longer borrows (nor, for a
    pinned guarantee, uses the cluster beyond its own)."""
    if cand.reclaim and _owed(ctx, cand, flavor) <= 0:
        return False
    _release(ctx, cand, -1)
    return True


def _owed(ctx: CycleContext, cand: Candidate, flavor: str) -> int:
    """What a reclaim may take back from the candidate's tenant: what it borrows, or for a
    pinned guarantee what it uses of the cluster beyond its own pinned guarantee there."""
    branch = cand.owed_by or cand.tenant
    owed = ctx.ledger.borrowing_within(cand.tenant, branch, flavor, ctx.leaving)
    if cand.pinned_cluster:
        owed = max(owed, pinned.excess(ctx.ledger, cand.tenant, flavor, cand.pinned_cluster))
    return owed


def _for_quota(
    ctx: CycleContext,
    job: JobRequest,
    flavor: str,
    replicas: tuple[int, ...],
    avoid: bool,
    candidates: list[Candidate],
) -> Plan | str | None:
    """Room exists; quota does not: the cheapest victims that make quota fit, minimised."""
    milli = job.resources.gpu_milli * len(replicas)
    mark = ctx.mark()
    removed = _until_quota_fits(ctx, job, flavor, candidates, [])
    if removed is None:
        ctx.rollback(mark)
        return QUOTA_SHORT
    for cand in reversed(removed):
        _release(ctx, cand, +1)
        if ctx.quota_verdict(job, flavor, milli) is None:
            removed.remove(cand)
        else:
            _release(ctx, cand, -1)
    placed = ctx.try_place(job, flavor, replicas, avoid_reserved=avoid)
    if placed is None:
        ctx.rollback(mark)
        return None
    return Plan(tuple(removed), placed)


def _until_quota_fits(
    ctx: CycleContext,
    job: JobRequest,
    flavor: str,
    candidates: list[Candidate],
    taken: list[Candidate],
) -> list[Candidate] | None:
    """Stop candidates (cheapest first, skipping ``taken``) until the job passes quota; the
    ones stopped, or None if even all of them do not make it (the state then still holds
    the removals: the caller rolls back)."""
    milli = job.resources.gpu_milli * job.gang_size
    out: list[Candidate] = []
    skip = {id(c) for c in taken}
    for cand in candidates:
        if ctx.quota_verdict(job, flavor, milli) is None:
            return out
        if cand.pinned_cluster and ctx.ledger.borrowing(cand.tenant, flavor) <= 0:
            continue  # a reclaim of room on a cluster, not of quota
        if id(cand) not in skip and _take(ctx, cand, flavor):
            out.append(cand)
    return out if ctx.quota_verdict(job, flavor, milli) is None else None


def _minimise(
    ctx: CycleContext,
    job: JobRequest,
    flavor: str,
    replicas: tuple[int, ...],
    avoid_reserved: bool,
    removed: list[Candidate],
) -> list[Candidate]:
    """Put back every victim the job can do without, most expensive first."""
    victims = list(removed)
    for cand in reversed(removed[:-1]):
        _release(ctx, cand, +1)
        if _fits(ctx, job, flavor, replicas, avoid_reserved):
            victims.remove(cand)
        else:
            _release(ctx, cand, -1)
    return victims


def _fits(
    ctx: CycleContext, job: JobRequest, flavor: str, replicas: tuple[int, ...], avoid: bool
) -> bool:
    need = job.resources.gpu_milli * len(replicas)
    if ctx.quota_verdict(job, flavor, need) is not None or ctx.state.free_milli(flavor) < need:
        return False
    mark = ctx.mark()
    placed = ctx.try_place(job, flavor, replicas, avoid_reserved=avoid)
    ctx.rollback(mark)
    return placed is not None


def _release(ctx: CycleContext, cand: Candidate, sign: int) -> None:
    """sign=-1 stops the candidate (gives its resources back), +1 restores it."""
    ctx.hold(cand.running.job, cand.running.flavor, cand.assignments, sign)


def listed_candidates(
    ctx: CycleContext, job: JobRequest, flavor: str, horizon: float | None = None
) -> list[tuple[Candidate, float]]:
    """Victim candidates for ``job`` on ``flavor``, cheapest first, each with when it may
    give way: now, or (kept when within ``wait_for_cheaper_s``) when it leaves its minimum
    runtime. Only the groups that may give way are visited: the job's tenant, best-effort
    jobs, and (when the job reclaims its guarantee) tenants that borrow; on a full cluster
    the rest are most jobs. ``horizon``: the latest time kept (by default now plus
    ``wait_for_cheaper_s``; ``plans.plan_later`` looks further).

    Cheapest first: elastic extras, best-effort jobs, then the others by how far taking the
    candidate alone would put its tenant below its guarantee (a reclaim: a borrower's job
    that fits in what it borrows goes first), class value, work lost, GPUs, youngest."""
    pc = ctx.priority_class(job)
    if not (pc.may_preempt and pc.counts_against_quota):
        return []
    milli = job.resources.gpu_milli * job.gang_size
    reclaim_ok = ctx.ledger.within_guarantee_after(job.tenant, flavor, milli)
    groups = [job.tenant, BEST_EFFORT_GROUP]
    borrow: dict[str, int] = {}
    owed_in: dict[str, str] = {}  # tenant -> the pinned cluster it uses beyond its own
    if reclaim_ok:
        only = pinned.owed_in(ctx.ledger, job.tenant, flavor, milli)
        for t in ctx.ledger.tenants:
            if t == job.tenant:
                continue
            b = ctx.ledger.borrowing_from(t, job.tenant, flavor, ctx.leaving)
            for cluster in only:
                if (e := pinned.excess(ctx.ledger, t, flavor, cluster)) > 0:
                    b, owed_in[t] = max(b, e), cluster
            if b > 0:
                groups.append(t)
                borrow[t] = b
    if horizon is None:
        horizon = ctx.now + ctx.profile.wait_for_cheaper_s
    keyed: list[tuple[tuple[object, ...], Candidate, float]] = []
    for tenant in groups:
        # A reclaim across the tree is owed by the victim's branch toward the job's tenant.
        branch = ctx.ledger.branch_toward(tenant, job.tenant)
        for running in ctx.live_by.get((flavor, tenant), {}).values():
            if running.job.id in ctx.fresh:
                continue
            for cand, at in _candidates_of(ctx, job, running, reclaim_ok):
                if at > horizon:
                    continue
                if cand.reclaim and running.leaving:
                    continue  # on its way back already: no borrowing to take
                if cand.reclaim and branch != tenant:
                    cand = replace(cand, owed_by=branch)
                if cand.reclaim and tenant in owed_in:
                    where = pinned.cluster_of(ctx.state, cand.assignments[0].node)
                    if where == owed_in[tenant]:
                        cand = replace(cand, pinned_cluster=where)
                    elif ctx.ledger.borrowing(tenant, flavor) <= 0:
                        continue  # within its guarantees where it runs
                breach = max(0, cand.rank[3] - borrow.get(cand.tenant, 0)) if cand.reclaim else 0
                keyed.append(((cand.rank[0], breach, *cand.rank[1:]), cand, at))
    keyed.sort(key=lambda k: k[0])
    return [(cand, at) for _, cand, at in keyed]


def _candidates_of(
    ctx: CycleContext, job: JobRequest, running: RunningJob, reclaim_ok: bool
) -> list[tuple[Candidate, float]]:
    victim = running.job
    if running.displaced and ctx.now - running.started_at < ctx.profile.ping_pong_guard_s:
        if job.id in running.displaced:
            return []
        if victim.tenant != job.tenant and job.tenant in _displaced_tenants(ctx, running):
            return []  # it reclaimed from the job's tenant: not reclaimed back within the guard
    same_tenant = victim.tenant == job.tenant
    if not any(a.elastic for a in running.assignments):
        relation = _relation(ctx, job, running)
        if relation is None:
            return []
        if relation[1] and not reclaim_ok:
            return []
        at = _eligible_at(ctx, job, running)
        cand = _candidate(ctx, running, running.assignments, relation[0], reclaim=relation[1])
        return [(cand, at)]
    extras = tuple(a for a in running.assignments if a.elastic)
    core = tuple(a for a in running.assignments if not a.elastic)
    out: list[tuple[Candidate, float]] = []
    if extras and (same_tenant or reclaim_ok):
        out.append((_candidate(ctx, running, extras, 0, reclaim=not same_tenant), ctx.now))
    relation = _relation(ctx, job, running)
    if core and relation is not None:
        cand = _candidate(ctx, running, core, relation[0], reclaim=relation[1])
        out.append((cand, _eligible_at(ctx, job, running)))
    return [(c, at) for c, at in out if not c.reclaim or reclaim_ok]


def _displaced_tenants(ctx: CycleContext, running: RunningJob) -> set[str]:
    """The tenants of the jobs ``running`` displaced (those still pending or running)."""
    if ctx.displaced_tenant is None:
        ctx.displaced_tenant = {
            j.id: j.tenant for j in ctx.snapshot.pending if j.id in ctx.guarded
        } | {r.job.id: r.job.tenant for r in ctx.snapshot.running if r.job.id in ctx.guarded}
    known = ctx.displaced_tenant
    return {known[j] for j in running.displaced if j in known}


def _relation(ctx: CycleContext, job: JobRequest, running: RunningJob) -> tuple[int, bool] | None:
    """(tier, needs-borrowing) when ``running`` may give way to ``job``; None otherwise."""
    mine, theirs = ctx.priority_class(job), ctx.priority_class(running.job)
    if not theirs.preemptible:
        return None
    if not theirs.counts_against_quota:
        return (1, False)
    if running.job.tenant == job.tenant:
        held = sum(a.gpu_milli for a in running.assignments if not a.elastic)
        if theirs.value >= mine.value or _too_large(ctx, job, mine, held):
            return None
        return (2, False)
    if ctx.profile.reclaim_any_priority or theirs.value < mine.value:
        return (2, True)
    return None


def _too_large(ctx: CycleContext, job: JobRequest, mine: PriorityClass, held: int) -> bool:
    """Within a tenant, a job preempts by priority only jobs of at most
    ``within_tenant_gpu_ratio`` times the GPUs it asks for (0: no bound), unless its class
    is critical: a small inference job does not evict its team's large training job.
    ``held``: the other job's milli-GPU (a running job's, its elastic extras apart)."""
    ratio = ctx.profile.within_tenant_gpu_ratio
    if not ratio or mine.critical:
        return False
    return held > ratio * job.resources.gpu_milli * job.gang_size


def would_preempt(ctx: CycleContext, job: JobRequest, other: JobRequest, flavor: str) -> bool:
    """Whether ``job`` could preempt ``other`` were ``other`` started now on ``flavor`` with its
    request: by priority within their tenant (the rules of ``_relation``: a strictly higher
    class that may preempt, ``other``'s preemptible and within the GPU ratio), or by a reclaim
    (``job`` stays within its guarantee, and ``other``'s branch toward it would borrow)."""
    mine, theirs = ctx.priority_class(job), ctx.priority_class(other)
    if not (mine.may_preempt and mine.counts_against_quota):
        return False
    if not (theirs.preemptible and theirs.counts_against_quota):
        return False
    held = other.resources.gpu_milli * other.gang_size
    ledger = ctx.ledger
    if other.tenant == job.tenant:
        return theirs.value < mine.value and not _too_large(ctx, job, mine, held)
    if not (ctx.profile.reclaim_any_priority or theirs.value < mine.value):
        return False
    if not ledger.within_guarantee_after(
        job.tenant, flavor, job.resources.gpu_milli * job.gang_size
    ):
        return False
    branch = ledger.branch_toward(other.tenant, job.tenant)
    return not ledger.within_guarantee_after(branch, flavor, held)


def preemptible_from(ctx: CycleContext, job: JobRequest, running: RunningJob) -> float | None:
    """The earliest time ``running`` may give way to ``job`` by the rules above (its minimum
    runtime and the ping-pong guard passed), or None when it never may. Backfill uses it: a
    reservation waits for a victim's minimum runtime, not for the victim's natural end."""
    pc = ctx.priority_class(job)
    relation = _relation(ctx, job, running)
    if not (pc.may_preempt and pc.counts_against_quota) or relation is None:
        return None
    if relation[1] and not (
        ctx.ledger.borrowing_from(running.job.tenant, job.tenant, running.flavor, ctx.leaving) > 0
        and ctx.ledger.within_guarantee_after(
            job.tenant, running.flavor, job.resources.gpu_milli * job.gang_size
        )
    ):
        return None
    start = running.started_at
    if not (pc.critical and ctx.profile.critical_overrides_min_runtime):
        start += ctx.profile.min_runtime_s
    if job.id in running.displaced or (
        relation[1] and running.displaced and job.tenant in _displaced_tenants(ctx, running)
    ):
        start = max(start, running.started_at + ctx.profile.ping_pong_guard_s)
    return max(start, ctx.now)


def _eligible_at(ctx: CycleContext, job: JobRequest, running: RunningJob) -> float:
    """When ``running`` leaves its minimum runtime for ``job`` (now or earlier: it has)."""
    if not running.started or (
        ctx.priority_class(job).critical and ctx.profile.critical_overrides_min_runtime
    ):
        return ctx.now
    return running.started_at + ctx.profile.min_runtime_s


def _candidate(
    ctx: CycleContext,
    running: RunningJob,
    assignments: tuple[ReplicaAssignment, ...],
    tier: int,
    *,
    reclaim: bool,
) -> Candidate:
    # The same for every preemptor of the cycle (while the job keeps its replicas): build once.
    key = (running.job.id, len(running.assignments), len(assignments), tier, reclaim)
    cached = ctx.candidates.get(key)
    if cached is None or cached.running is not running:
        lost = work_lost_gpu_s(running, assignments, ctx.now)
        value = ctx.priority_class(running.job).value
        milli = sum(a.gpu_milli for a in assignments)
        rank = (tier, value, lost, milli, -running.started_at, running.job.id)
        cached = ctx.candidates[key] = Candidate(running, assignments, tier == 0, reclaim, rank)
    return cached
