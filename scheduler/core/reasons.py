"""Reasons a person can read, with numbers, for every job left waiting."""

from __future__ import annotations

import numpy as np

from scheduler.core.context import CycleContext
from scheduler.core.fit import Misfit, describe
from scheduler.core.quota import QuotaVerdict, gpus
from scheduler.core.types import MILLI_PER_GPU, JobRequest, Reservation, WaitCode, WaitReason


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


def cheaper_victims(reason: WaitReason, at: float, now: float) -> WaitReason:
    """``reason``, and that a preemption is planned once cheaper victims may give way."""
    wait = max(0.0, at - now)
    return WaitReason(
        reason.job_id,
        reason.code,
        f"{reason.message}; preemption planned in {wait:.0f} s, when the cheapest victims "
        "leave their minimum runtime",
    )


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
        f"nothing in the cluster can hold this job today: {describe(misfits)}",
    )


def capacity(ctx: CycleContext, job: JobRequest, flavor: str) -> WaitReason:
    """Why the gang finds no room on ``flavor``: no matching node, GPU memory on shared
    devices, fragmentation (enough free in total, not together) or plain capacity."""
    state, res = ctx.state, job.resources
    static = state.static_mask(flavor, job.pools, job.tolerations)
    if not static.any():
        pools = f" in pools {', '.join(job.pools)}" if job.pools else ""
        return WaitReason(
            job.id,
            WaitCode.NO_MATCHING_NODE,
            f"no schedulable {flavor} node{pools} whose taints the job tolerates",
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
