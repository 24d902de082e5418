"""What a cycle reads of a pending job that depends only on the job and on what a held base
is keyed by (nodes, tenants, priority classes): whether the request is valid, the flavors it
may use, and the keys by which equal requests share the cycle's memo and quota floors.

A job waits through many cycles, and the daemon hands the engine the very same job object
while its row is unchanged: the facts are worked out once per job object and kept with the
held base (``context.Held``), dropped with it. Without a held base they last one cycle.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from scheduler.core.types import MILLI_PER_GPU, JobRequest, Resources

if TYPE_CHECKING:
    from scheduler.core.context import CycleContext

# Distinct keys remembered before they are forgotten (a long-lived base sees many shapes).
MAX_KEYS = 1 << 16


@dataclass(frozen=True, slots=True)
class JobFacts:
    job: JobRequest
    invalid: str  # why the request cannot be scheduled at all; "" when it can
    flavors: tuple[str, ...]  # its allowed flavors that some node has (all if none set)
    milli: int  # milli-GPU of its gang
    # Equal for equal requests, different otherwise (numbered keys: an int hashes at once):
    # who asks and what (the memo's key), who asks on which flavors and pools (a floor's;
    # the two are never compared with each other).
    request: int
    asker: int


class Facts:
    """The facts of the jobs a base has seen, by job id, for as long as the job object is the
    same (a changed row is a new object)."""

    __slots__ = ("_by_job", "_keys", "_numbered")

    def __init__(self) -> None:
        self._by_job: dict[str, JobFacts] = {}
        self._keys: dict[tuple[object, ...], int] = {}
        self._numbered = 0  # never goes back: a number is never given to two keys

    def of(self, ctx: CycleContext, job: JobRequest) -> JobFacts:
        kept = self._by_job.get(job.id)
        if kept is not None and kept.job is job:
            return kept
        if len(self._keys) >= MAX_KEYS:  # a key seen again gets a new number: a memo miss
            self._keys.clear()
        tenant = ctx.ledger.tenants.get(job.tenant)
        user = job.user if tenant is not None and tenant.user_caps else ""
        who = (job.tenant, user, job.priority_class, job.tolerations)
        where = (job.pools, job.clusters, job.regions, job.preferred_clusters)
        shape = (job.resources, job.replicas, job.min_replicas, job.flavors, *where)
        facts = JobFacts(
            job,
            _invalid(ctx, job),
            _flavors(ctx, job),
            job.resources.gpu_milli * job.gang_size,
            self._number((*who, *shape)),
            self._number((*who, job.flavors, *where)),
        )
        self._by_job[job.id] = facts
        return facts

    def keep(self, jobs: list[JobRequest]) -> None:
        """Forget the jobs not in ``jobs`` (the cycle's queue): they started or left."""
        if len(self._by_job) > len(jobs):
            ids = {job.id for job in jobs}
            self._by_job = {i: f for i, f in self._by_job.items() if i in ids}

    def _number(self, key: tuple[object, ...]) -> int:
        number = self._keys.get(key)
        if number is None:
            number = self._keys[key] = self._numbered
            self._numbered += 1
        return number


def _invalid(ctx: CycleContext, job: JobRequest) -> str:
    res = job.resources
    if job.tenant not in ctx.ledger.tenants:
        return f"unknown tenant {job.tenant!r}"
    if job.priority_class not in ctx.classes:
        return f"unknown priority class {job.priority_class!r}"
    if job.replicas < 1 or not 1 <= job.gang_size <= job.replicas:
        return f"replicas {job.replicas} with min_replicas {job.min_replicas}"
    if min(res.gpu_milli, res.gpu_memory_mib, res.cpu_milli, res.memory_mib, res.rdma) < 0:
        return "negative resource request"
    if res.gpu_milli >= MILLI_PER_GPU and res.gpu_milli % MILLI_PER_GPU:
        return f"gpu_milli {res.gpu_milli} is neither a share (< 1000) nor whole GPUs"
    return ""


def _flavors(ctx: CycleContext, job: JobRequest) -> tuple[str, ...]:
    known = ctx.state.flavor_names
    return tuple(f for f in job.flavors if f in known) if job.flavors else tuple(known)


Shape = tuple[Resources, tuple[str, ...]]


class Mix:
    """The request mix the fragmentation scorer weighs: how many jobs, pending or running,
    ask each (resources, flavors). Kept with a held base from cycle to cycle by what
    changed: the running jobs that started or ended (``run``, from ``build_context``'s
    comparison) and the pending jobs that came, went or changed (``of``)."""

    __slots__ = ("_pending", "_pending_mix", "_running_mix")

    def __init__(self) -> None:
        self._pending: dict[str, JobRequest] | None = {}
        self._pending_mix: Counter[Shape] = Counter()
        self._running_mix: Counter[Shape] = Counter()

    def run(self, job: JobRequest, sign: int) -> None:
        """``job`` started running (+1) or stopped (-1)."""
        _count(self._running_mix, job, sign)

    def of(self, pending: Sequence[JobRequest]) -> Counter[Shape]:
        """The mix of ``pending`` and of what runs."""
        now = {job.id: job for job in pending}
        before, mix = self._pending, self._pending_mix
        if before is None or len(now) != len(pending):  # a job listed twice: count afresh
            mix = self._pending_mix = Counter()
            for job in pending:
                _count(mix, job, +1)
        else:
            for job_id, job in before.items():
                if now.get(job_id) is not job:
                    _count(mix, job, -1)
            for job_id, job in now.items():
                if before.get(job_id) is not job:
                    _count(mix, job, +1)
        # which jobs the count holds, when each is there once
        self._pending = now if len(now) == len(pending) else None
        return mix + self._running_mix


def _count(mix: Counter[Shape], job: JobRequest, sign: int) -> None:
    shape = (job.resources, job.flavors)
    left = mix[shape] + sign
    if left:
        mix[shape] = left
    else:
        del mix[shape]
