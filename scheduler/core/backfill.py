"""Phase 5, backfill: hold devices for the head job that waits on capacity.

The first job in order that passes quota but finds no room (even by preemption) gets a
reservation: running jobs are released in the order they are expected to end (start plus
max runtime, else the profile's ``unknown_runtime_s``), or sooner when the head job may
preempt them once their minimum runtime has passed, until its gang fits; that time and those
devices are the reservation. A later job may then start only if it ends (by its own max
runtime) before the reservation starts, or uses no reserved device.

Only enforced bounds count (``JobRequest.runtime_bound_s``), as Slurm's backfill uses
``--time``: the submitter's ``estimated_runtime_s`` is not enforced, so a job that gave a short
one could start in the gap and then hold the head job's devices long past it.
"""

from __future__ import annotations

from scheduler.core.context import CycleContext
from scheduler.core.preemption import preemptible_from
from scheduler.core.types import JobRequest, Reservation, RunningJob


def expected_end(ctx: CycleContext, running: RunningJob) -> float:
    bound = running.job.runtime_bound_s
    return running.started_at + (bound if bound is not None else ctx.profile.unknown_runtime_s)


def frees_for(ctx: CycleContext, job: JobRequest, running: RunningJob) -> float:
    """When ``running`` is expected to leave its devices to ``job``: at its end, or sooner
    when ``job`` may preempt it once its minimum runtime has passed."""
    end = expected_end(ctx, running)
    victim_from = preemptible_from(ctx, job, running)
    return end if victim_from is None else min(end, victim_from)


def ends_before_reservation(ctx: CycleContext, job: JobRequest) -> bool:
    """Whether ``job`` started now surely ends before the cycle's reservation begins."""
    if ctx.reservation is None:
        return True
    bound = job.runtime_bound_s
    return bound is not None and ctx.now + bound <= ctx.reservation.start_at


def reserve(
    ctx: CycleContext, job: JobRequest, flavor: str, replicas: tuple[int, ...]
) -> Reservation | None:
    """The earliest expected start of ``job`` on ``flavor`` and the devices it would take;
    None when it would not fit even on an empty flavor. Leaves state and ledger unchanged."""
    ending = sorted(
        (frees_for(ctx, job, r), r.job.id, r) for r in ctx.live.values() if r.flavor == flavor
    )
    need = job.resources.gpu_milli * len(replicas)
    mark = ctx.mark()
    try:
        for position, (end, _, running) in enumerate(ending):
            # Placement alone decides where the gang would fit: quota is not looked at.
            ctx.hold_devices(running.job, running.assignments, -1)
            more_at_same_time = position + 1 < len(ending) and ending[position + 1][0] == end
            if more_at_same_time or ctx.state.free_milli(flavor) < need:
                continue
            placed = ctx.placer.place_gang(job, flavor, replicas, avoid_reserved=False)
            if placed is not None:
                index = ctx.state.index
                devices = tuple(
                    (a.node, s.device) for a in placed for s in a.shares if a.node in index
                )
                return Reservation(job.id, flavor, end, devices)
        return None
    finally:
        ctx.rollback(mark)


def hold_reservation(ctx: CycleContext, reservation: Reservation) -> None:
    ctx.reservation = reservation
    index = ctx.state.index
    ctx.state.reserve([(index[node], device) for node, device in reservation.devices])
