"""Reasons a person can read, with numbers, for every job left waiting."""

from __future__ import annotations

import numpy as np

from scheduler.core.clusters import NO_CLUSTER
from scheduler.core.context import CycleContext
from scheduler.core.fit import Misfit, describe
from scheduler.core.quota import QuotaVerdict, gpus
from scheduler.core.types import (
    MILLI_PER_GPU,
    JobRequest,
    PlannedPreemption,
    PreemptionCause,
    Reservation,
    WaitCode,
    WaitReason,
)


def backoff(job: JobRequest, now: float) -> WaitReason:
    wait = job.not_before - now
    return WaitReason(
        job.id, WaitCode.BACKOFF, f"retry {job.attempt} backs off for {wait:.0f} s more"
    )


def quota(job: JobRequest, verdict: QuotaVerdict) -> WaitReason:
    code = WaitCode.USER_CAP if verdict.user_cap else WaitCode.QUOTA
    return WaitReason(job.id, code, verdict.message)


def reservation(job: JobRequest, held: Reservation, now: float) -> WaitReason:
    minutes = max(0.0, held.start_at - now) / 60
    return WaitReason(
        job.id,
        WaitCode.RESERVATION,
        f"waiting for reservation of job {held.job_id}, expected in {minutes:.0f} min",
    )


def behind(job: JobRequest, holder: JobRequest) -> WaitReason:
    """Held back for a job that waits for room this job would take, and could preempt it
    there: of higher priority in its tenant, or reclaiming its guarantee
    (``Profile.hold_for_higher_priority``). Another tenant's job is not named."""
    whose = (
        "of higher priority in its team"
        if holder.tenant == job.tenant
        else ("of a team reclaiming its guarantee")
    )
    return WaitReason(
        job.id,
        WaitCode.RESERVATION,
        f"waiting behind a job {whose}, which waits for room this job would take (started "
        "now, it would be preempted for it)",
    )


def planned(reason: WaitReason, plan: PlannedPreemption, now: float) -> WaitReason:
    """``reason``, and the preemption planned for the job: whose jobs, how many GPUs, when.
    Another tenant is named only as "reclaims its guarantee from <slug>", the phrase
    ``reason_text`` looks for to hide slugs from those who may not know them; victims are
    counted, not named."""
    return WaitReason(reason.job_id, reason.code, f"{reason.message}; {plan_text(plan, now)}", plan)


def plan_text(plan: PlannedPreemption, now: float) -> str:
    """ "assist reclaims its guarantee from search (6 L40S lent): preemption planned in
    about 2 min, when its job leaves its minimum runtime"; "will preempt 1 job of lower
    priority (2 H100): preemption planned in 40 s, when it leaves its minimum runtime"."""
    count = len(plan.victims)
    jobs = "1 job" if count == 1 else f"{count} jobs"
    planned_in = f"preemption planned {in_time(plan.at - now)}"
    if plan.cause == PreemptionCause.RECLAIM:
        lenders = " and ".join(plan.tenants)
        leave = "its job leaves its" if count == 1 else f"their {count} jobs leave their"
        return (
            f"{plan.tenant} reclaims its guarantee from {lenders} ({gpus(plan.milli)} "
            f"{plan.flavor} lent): {planned_in}, when {leave} minimum runtime"
        )
    victims = {
        PreemptionCause.PRIORITY: f"{jobs} of lower priority",
        PreemptionCause.BEST_EFFORT: f"{jobs} of best-effort class",
        PreemptionCause.ELASTIC: f"elastic replicas of {jobs}",
    }[plan.cause]
    leave = "it leaves its" if count == 1 else "they leave their"
    return (
        f"will preempt {victims} ({gpus(plan.milli)} {plan.flavor}): {planned_in}, "
        f"when {leave} minimum runtime"
    )


def in_time(seconds: float) -> str:
    """ "in 40 s", "in about 2 min", "in about 3 h": whole units, never "1 minutes"."""
    seconds = max(0.0, seconds)
    if seconds < 90:
        return f"in {seconds:.0f} s"
    if seconds < 90 * 60:
        return f"in about {seconds / 60:.0f} min"
    return f"in about {seconds / 3600:.0f} h"


def invalid(job: JobRequest, why: str) -> WaitReason:
    return WaitReason(job.id, WaitCode.INVALID, f"invalid job: {why}")


def no_flavor(job: JobRequest) -> WaitReason:
    wanted = ", ".join(job.flavors) or "any GPU"
    return WaitReason(job.id, WaitCode.NO_MATCHING_NODE, f"no node has {wanted}")


def never_fits(job: JobRequest, misfits: list[Misfit]) -> WaitReason:
    """No usable node of any allowed flavor could hold the job even empty: waiting for
    others to finish will not help, only other nodes (or a smaller request) will."""
    return WaitReason(
        job.id,
        WaitCode.NO_MATCHING_NODE,
        f"nothing in the cluster can hold this job today: {describe(misfits)}{_where(job)}",
    )


def _where(job: JobRequest) -> str:
    """Where the job asked to run, as " in pools x, y in clusters z"; "" when anywhere."""
    asked = (("pools", job.pools), ("clusters", job.clusters), ("regions", job.regions))
    return "".join(
        " in a cluster with the labels it asks for (no cluster has them now)"
        if names == (NO_CLUSTER,)
        else f" in {what} {', '.join(names)}"
        for what, names in asked
        if names
    )


def capacity(ctx: CycleContext, job: JobRequest, flavor: str) -> WaitReason:
    """Why the gang finds no room on ``flavor``: no matching node, GPU memory on shared
    devices, fragmentation (enough free in total, not together) or plain capacity."""
    state, res = ctx.state, job.resources
    static = state.static_mask(flavor, job.pools, job.tolerations, job.clusters, job.regions)
    if not static.any():
        return WaitReason(
            job.id,
            WaitCode.NO_MATCHING_NODE,
            f"no schedulable {flavor} node{_where(job)} whose taints the job tolerates",
        )
    if res.is_shared:
        return _shared(ctx, job, flavor, static)
    if res.whole_gpus:
        return _whole(ctx, job, flavor, static)
    kept = (
        f" for jobs without GPUs, which may hold {state.cpu_only_share:.1%} of a node's CPU "
        "and memory (the rest is kept for its GPUs)"
        if state.cpu_only_share < 1
        else ""
    )
    return WaitReason(
        job.id,
        WaitCode.CAPACITY,
        f"no {flavor} node has {res.cpu_milli} mCPU and {res.memory_mib} MiB memory free{kept}",
    )


def _whole(ctx: CycleContext, job: JobRequest, flavor: str, static: np.ndarray) -> WaitReason:
    state, k, n = ctx.state, job.resources.whole_gpus, job.gang_size
    free = state.whole_free[static]
    total, best = int(free.sum()), int(free.max(initial=0))
    if total < k * n:
        return WaitReason(
            job.id, WaitCode.CAPACITY, f"needs {k * n} free {flavor}; {total} free in total"
        )
    if best < k:
        message = f"no node has {k} free {flavor} together; {total} free in total"
        return WaitReason(job.id, WaitCode.FRAGMENTATION, message)
    if n > 1:
        fit = int((free // k).sum())
        if fit < n:
            message = (
                f"gang of {n} x {k} {flavor}: only {fit} replicas fit on free GPUs; "
                f"{total} free in total"
            )
            return WaitReason(job.id, WaitCode.FRAGMENTATION, message)
    res = job.resources
    return WaitReason(
        job.id,
        WaitCode.CAPACITY,
        f"no node with {k} free {flavor} also has {res.cpu_milli} mCPU, "
        f"{res.memory_mib} MiB memory and {res.rdma} RDMA free",
    )


def _shared(ctx: CycleContext, job: JobRequest, flavor: str, static: np.ndarray) -> WaitReason:
    state, res = ctx.state, job.resources
    devices = state.usable & static[:, None]
    share_ok = devices & (state.dev_free >= res.gpu_milli)
    if not share_ok.any():
        most = int(np.where(devices, state.dev_free, 0).max(initial=0))
        return WaitReason(
            job.id,
            WaitCode.CAPACITY,
            f"no {flavor} device has {gpus(res.gpu_milli)} GPU free; "
            f"the most free on one device is {most / MILLI_PER_GPU:g}",
        )
    best_mem = int(np.where(share_ok, state.dev_mem, 0).max())
    if best_mem < res.gpu_memory_mib:
        return WaitReason(
            job.id,
            WaitCode.GPU_MEMORY,
            f"no {flavor} device has {res.gpu_memory_mib} MiB GPU memory free with "
            f"{gpus(res.gpu_milli)} GPU free; the most is {best_mem} MiB",
        )
    return WaitReason(
        job.id,
        WaitCode.CAPACITY,
        f"no {flavor} node with a {gpus(res.gpu_milli)} GPU share free also has "
        f"{res.cpu_milli} mCPU and {res.memory_mib} MiB memory free",
    )
