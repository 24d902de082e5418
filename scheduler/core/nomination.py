"""Nominations: the room a preemptor's victims free is held for it until it is placed.

A preemptor does not start in the cycle that preempts for it: the daemon binds it once its
victims' pods are gone, cycles later, and by then the victims are back in the queue. Without
a hold, the first job in queue order takes the freed room, and that can be the victim itself
(its tenant's head ranks before the preemptor's); the preemptor then preempts it again at
once (not started, it has no minimum runtime to protect it), and so on: the livelock of
issue 35. As kube-scheduler's ``nominatedNodeName``, the engine is told the placements the
last cycle made for jobs still waiting (``Snapshot.nominated``) and, before any job is
considered, holds the part of each that is free now, devices and quota, for its job. Every
job considered before it sees that room taken; the job itself gives the hold back when its
turn comes (``release``) and is placed as usual, most often right there.

A nomination lives one cycle: the caller passes the placements of the cycle before that are
still waiting, so one whose job was placed, left, or was not placed again lapses by itself.
While the victims it waits for still run (their pods are going), the job takes the same plan
again (``retake``) instead of searching anew: a victim inside its minimum runtime would
otherwise protect itself while it stops, the plan would lapse, and the room with it; or a
cheaper victim would be taken besides. The caller names only victims that are really
stopping (a victim the daemon could not preempt is searched for again).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from scheduler.core.context import CycleContext
from scheduler.core.preemption import Candidate, Plan
from scheduler.core.types import JobRequest, Placement, ReplicaAssignment


def hold_nominated(ctx: CycleContext, nominated: Sequence[Placement]) -> None:
    """Hold, for each pending job named in ``nominated`` (its first nomination), the devices
    of its placement that are free now and their quota. Devices its victims still hold are
    not free: nobody else can take them either."""
    if not nominated:  # most cycles: no pass over a queue of thousands
        return
    pending = {job.id: job for job in ctx.snapshot.pending if job.id not in ctx.live}
    for placement in nominated:
        job = pending.get(placement.job_id)
        if job is None or job.id in ctx.nominated:
            continue
        free = tuple(a for a in _free_part(ctx, placement.assignments) if a.shares)
        ctx.hold(job, placement.flavor, free, +1)
        ctx.nominated[job.id] = (placement, free)


def retake(ctx: CycleContext, job: JobRequest) -> tuple[str, Plan] | None:
    """The flavor and plan of ``job``'s nomination again, when victims it waits for still
    run: state and ledger then hold the job and no longer hold those victims, as after a
    victim search. None (nothing changed) when none of them runs or the room is no longer
    whole."""
    held = ctx.nominated.get(job.id)
    if held is None:
        return None
    placement = held[0]
    # A victim placed again this cycle (back in the queue, then on other devices) is a new
    # run, not the one being stopped: as in a victim search, it is not taken again.
    running = [ctx.live[v] for v in placement.victims if v in ctx.live and v not in ctx.fresh]
    if not running:
        return None
    mark = ctx.mark()
    release(ctx, job)
    for r in running:
        ctx.hold(r.job, r.flavor, r.assignments, -1)
    whole = tuple(_free_part(ctx, placement.assignments))
    if whole != placement.assignments:  # taken meanwhile: search as usual
        ctx.rollback(mark)
        ctx.nominated[job.id] = held
        return None
    ctx.hold(job, placement.flavor, placement.assignments, +1)
    victims = tuple(
        Candidate(r, r.assignments, False, r.job.tenant != job.tenant, (0, 0, 0.0, 0, 0.0, ""))
        for r in running
    )
    return placement.flavor, Plan(victims, placement.assignments)


def release(ctx: CycleContext, job: JobRequest) -> bool:
    """Give back what is held for ``job``, when its turn comes; whether anything was."""
    held = ctx.nominated.pop(job.id, None)
    if held is None:
        return False
    ctx.hold(job, held[0].flavor, held[1], -1)
    return True


def _free_part(
    ctx: CycleContext, assignments: Iterable[ReplicaAssignment]
) -> Iterable[ReplicaAssignment]:
    """Each replica with only its device shares that are usable and free now."""
    state = ctx.state
    devices = state.usable.shape[1]
    for a in assignments:
        i = state.index.get(a.node)
        if i is None:
            continue
        shares = tuple(
            s
            for s in a.shares
            if 0 <= s.device < devices
            and state.usable[i, s.device]
            and state.dev_free[i, s.device] >= s.milli
            and state.dev_mem[i, s.device] >= s.memory_mib
        )
        yield ReplicaAssignment(a.replica, a.node, shares, a.elastic)
