"""Preemptions the engine plans for later: what a waiting job will take, and when.

A job that no victim set can make room for now may still have one once running jobs leave
their minimum runtime (a lender whose borrower is young, a high-priority job behind its
team's fresh low-priority one). Its reason then says so (``reasons.planned``): which
victims, of whom, how many GPUs, and when, so that a lender does not see a bare quota line.
The plan is the engine's own: the earliest time at which the candidates eligible by then
suffice, and the least-harm set among them (``preemption.harm``), as a cycle at that time
would choose it (bar jobs that start or end meanwhile).
"""

from __future__ import annotations

import math

from scheduler.core.context import CycleContext
from scheduler.core.preemption import (
    Candidate,
    Plan,
    _best,
    _fits,
    _owed,
    _take,
    listed_candidates,
)
from scheduler.core.types import JobRequest, PlannedPreemption, PreemptionCause


def cause_of(candidate: Candidate) -> PreemptionCause:
    """Why ``candidate`` gives way, as ``cycle._why`` words it."""
    if candidate.elastic_only:
        return PreemptionCause.ELASTIC
    if candidate.reclaim:
        return PreemptionCause.RECLAIM
    if candidate.rank[0] == 1:  # the best-effort tier (`preemption._relation`)
        return PreemptionCause.BEST_EFFORT
    return PreemptionCause.PRIORITY


def describe(
    job: JobRequest, flavor: str, at: float, victims: tuple[Candidate, ...]
) -> PlannedPreemption:
    """The plan of taking ``victims`` for ``job`` at ``at``; its cause is the most telling
    of theirs (a reclaim, then priority, best-effort, elastic replicas)."""
    causes = {cause_of(v) for v in victims}
    order = (
        PreemptionCause.RECLAIM,
        PreemptionCause.PRIORITY,
        PreemptionCause.BEST_EFFORT,
        PreemptionCause.ELASTIC,
    )
    cause = next((c for c in order if c in causes), PreemptionCause.PRIORITY)
    return PlannedPreemption(
        at=at,
        tenant=job.tenant,
        flavor=flavor,
        cause=cause,
        victims=tuple(v.running.job.id for v in victims),
        tenants=tuple(sorted({v.tenant for v in victims if v.tenant != job.tenant})),
        milli=sum(a.gpu_milli for v in victims for a in v.assignments),
    )


def plan_later(
    ctx: CycleContext,
    job: JobRequest,
    flavor: str,
    replicas: tuple[int, ...],
    avoid_reserved: bool,
) -> PlannedPreemption | None:
    """For a job that found no victims now: the earliest time the candidates eligible by
    then could make room for it on ``flavor`` (quota and devices), with the victims a cycle
    would take then; None when none could however long it waited (a job the ping-pong
    guard protects is no candidate). Leaves state and ledger as they were.

    Enough-by-``t`` only grows with ``t`` (more candidates, never fewer), so the earliest
    such time is a bisection over the candidates' distinct eligibility times: a few trials
    of stopping every eligible candidate, not one per time."""
    listed = listed_candidates(ctx, job, flavor, horizon=math.inf)
    listed = listed[: ctx.profile.max_preemption_candidates]
    times = sorted({at for _, at in listed if at > ctx.now})
    if not times or not _enough(ctx, job, flavor, replicas, avoid_reserved, listed, times[-1]):
        return None
    low, high = 0, len(times) - 1
    while low < high:  # the first time that is enough
        middle = (low + high) // 2
        if _enough(ctx, job, flavor, replicas, avoid_reserved, listed, times[middle]):
            high = middle
        else:
            low = middle + 1
    at = times[low]
    eligible = [c for c, when in listed if when <= at]
    borrow = {c.tenant: _owed(ctx, c, flavor) for c in eligible if c.reclaim}
    mark = ctx.mark()
    try:
        plan = _best(ctx, job, flavor, replicas, avoid_reserved, eligible, borrow)
    finally:
        ctx.rollback(mark)
    victims = plan.victims if isinstance(plan, Plan) else tuple(eligible)
    return describe(job, flavor, at, victims)


def _enough(
    ctx: CycleContext,
    job: JobRequest,
    flavor: str,
    replicas: tuple[int, ...],
    avoid_reserved: bool,
    listed: list[tuple[Candidate, float]],
    by: float,
) -> bool:
    """Whether the job fits once every candidate eligible by ``by`` has stopped."""
    mark = ctx.mark()
    try:
        for cand, at in listed:
            if at <= by:
                _take(ctx, cand, flavor)
        return _fits(ctx, job, flavor, replicas, avoid_reserved)
    finally:
        ctx.rollback(mark)
