"""What the phases of one cycle share: the tentative state, the quota ledger, the placer.

Built once per ``run_cycle`` from the snapshot: every running allocation is taken on the
state and charged to the ledger, so both start from what really runs. A caller that runs
cycle after cycle (the daemon) may keep that base in a ``Held`` between them: the next
cycle then takes and gives back only what started or ended since, and the cycle's own
tentative changes are rolled back at its end.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from scheduler.core import pinned
from scheduler.core.facts import Facts, Mix
from scheduler.core.placement import Placer
from scheduler.core.profile import Profile
from scheduler.core.quota import QuotaLedger, QuotaVerdict
from scheduler.core.tentative import BoolArray, ClusterState
from scheduler.core.types import (
    JobRequest,
    Placement,
    PriorityClass,
    ReplicaAssignment,
    Reservation,
    RunningJob,
    Snapshot,
)

if TYPE_CHECKING:
    from scheduler.core.preemption import Candidate

BEST_EFFORT_GROUP = "\x00best-effort"  # not a tenant name: tenants are slugs
BEST_EFFORT = PriorityClass("<unknown>", 0, may_preempt=False, counts_against_quota=False)


@dataclass(slots=True)
class Held:
    """The state and ledger holding what ran at the last cycle, for the next one. Valid
    while the nodes, tenants, priority classes and profile are the same (``key``)."""

    key: tuple[object, ...] | None = None
    state: ClusterState | None = None
    ledger: QuotaLedger | None = None
    running: dict[str, RunningJob] = field(default_factory=dict)
    facts: Facts = field(default_factory=Facts)  # of the pending jobs, under the same key
    mix: Mix = field(default_factory=Mix)  # of the jobs pending and running

    def drop(self) -> None:
        self.key, self.state, self.ledger, self.running = None, None, None, {}
        self.facts, self.mix = Facts(), Mix()

    def free_milli(self) -> int | None:
        """Milli-GPU of usable devices that what runs (at the last cycle's snapshot) leaves
        free; None when no base is held."""
        return None if self.state is None else sum(self.state.flavor_free)


@dataclass(slots=True)
class CycleContext:
    snapshot: Snapshot
    profile: Profile
    state: ClusterState
    ledger: QuotaLedger
    placer: Placer
    classes: dict[str, PriorityClass]
    facts: Facts = field(default_factory=Facts)
    live: dict[str, RunningJob] = field(default_factory=dict)
    fresh: set[str] = field(default_factory=set)
    reservation: Reservation | None = None
    guarded: set[str] = field(default_factory=set)  # jobs a running job displaced (ping-pong)
    # job -> its nomination and the part of it held until its turn (core.nomination)
    nominated: dict[str, tuple[Placement, tuple[ReplicaAssignment, ...]]] = field(
        default_factory=dict
    )
    displaced_tenant: dict[str, str] | None = None  # their tenants, when first needed
    shrunk: set[str] = field(default_factory=set)  # elastic jobs that gave way: no regrowth now
    # live jobs by (flavor, tenant), best-effort ones under (flavor, BEST_EFFORT_GROUP):
    # victim search looks only at the groups that may give way
    live_by: dict[tuple[str, str], dict[str, RunningJob]] = field(default_factory=dict)
    # victim candidates, built once per cycle per job (see preemption._candidate)
    candidates: dict[tuple[str, int, int, int, bool], Candidate] = field(default_factory=dict)
    # The quota charges that turn the ledger (this cycle's victims stopped, the placements
    # that wait for them charged) into what runs until the victims' pods are gone (victims
    # charged, those placements not): (job, flavor, replicas, +1 charge or -1 refund); and
    # the victims' ids.
    stopping: list[tuple[JobRequest, str, tuple[ReplicaAssignment, ...], int]] = field(
        default_factory=list
    )
    victims: list[str] = field(default_factory=list)
    # Milli-GPU held per (tenant or ancestor, flavor) by jobs already giving their devices
    # back (``RunningJob.leaving``): charged to the ledger while their pods stop, but no
    # borrowing to reclaim (a reclaim of it would take what is on its way back, twice).
    leaving: dict[tuple[str, str], int] = field(default_factory=dict)

    @property
    def now(self) -> float:
        return self.snapshot.now

    def priority_class(self, job: JobRequest) -> PriorityClass:
        return self.classes.get(job.priority_class, BEST_EFFORT)

    def set_live(self, running: RunningJob) -> None:
        """Add or replace a job holding devices (keep ``live`` and ``live_by`` in step)."""
        self.drop_live(running.job.id)
        self.live[running.job.id] = running
        self.live_by.setdefault(self._group(running), {})[running.job.id] = running

    def drop_live(self, job_id: str) -> None:
        running = self.live.pop(job_id, None)
        if running is not None:
            del self.live_by[self._group(running)][job_id]

    def _group(self, running: RunningJob) -> tuple[str, str]:
        tenant = running.job.tenant if self.counts_against_quota(running.job) else BEST_EFFORT_GROUP
        return (running.flavor, tenant)

    def counts_against_quota(self, job: JobRequest) -> bool:
        return self.priority_class(job).counts_against_quota

    def hold(
        self, job: JobRequest, flavor: str, assignments: Sequence[ReplicaAssignment], sign: int
    ) -> None:
        """Take (+1) or give back (-1) ``assignments`` of ``job`` on state and ledger."""
        self.hold_devices(job, assignments, sign)
        if self.counts_against_quota(job):
            self._charge(job, flavor, assignments, sign)

    def _charge(
        self, job: JobRequest, flavor: str, assignments: Sequence[ReplicaAssignment], sign: int
    ) -> None:
        """The ledger's side of ``hold``: the flavor, and the pinned keys of the clusters."""
        milli = sum(a.gpu_milli for a in assignments)
        self.ledger.charge(job.tenant, job.user, flavor, sign * milli)
        pinned.charge(self.ledger, self.state, job, flavor, assignments, sign)

    def hold_devices(
        self, job: JobRequest, assignments: Sequence[ReplicaAssignment], sign: int
    ) -> None:
        """As ``hold``, on the state alone (what placement sees), not the ledger."""
        res, index = job.resources, self.state.index
        for a in assignments:
            node = index.get(a.node)
            if node is not None:
                self.state.apply(node, a.shares, res.cpu_milli, res.memory_mib, res.rdma, sign)

    def mark(self) -> tuple[int, int]:
        return self.state.mark(), self.ledger.mark()

    def rollback(self, mark: tuple[int, int]) -> None:
        self.state.rollback(mark[0])
        self.ledger.rollback(mark[1])

    def quota_verdict(self, job: JobRequest, flavor: str, milli: int) -> QuotaVerdict | None:
        if not self.counts_against_quota(job):
            return None
        found = self.ledger.check(job.tenant, job.user, flavor, milli)
        return found or pinned.verdict(self.ledger, self.state, job, flavor, milli)

    def pinned_mask(self, job: JobRequest, flavor: str, milli: int) -> BoolArray | None:
        """The nodes of ``flavor`` the job's quotas pinned per cluster leave it (``None``:
        all): ``Placer.narrow``."""
        if not self.counts_against_quota(job):
            return None
        return pinned.mask(self.ledger, self.state, job, flavor, milli)

    def relies_on_stopping(
        self, job: JobRequest, flavor: str, assignments: Sequence[ReplicaAssignment]
    ) -> bool:
        """Whether `job`, just placed with `assignments` on `flavor` (and charged for them),
        fits its quota (a pinned limit on their cluster included) only on what this cycle's
        victims free: not with the ledger as it is while they still run (`stopping`
        applied, the job itself not yet charged)."""
        if not self.stopping or not self.counts_against_quota(job) or not assignments:
            return False
        milli = sum(a.gpu_milli for a in assignments)
        mark = self.ledger.mark()
        try:
            self._charge(job, flavor, assignments, -1)
            for held, at, theirs, sign in self.stopping:
                self._charge(held, at, theirs, sign)
            if self.ledger.check(job.tenant, job.user, flavor, milli) is not None:
                return True
            barred = pinned.over_limit(self.ledger, job.tenant, flavor, milli)
            return pinned.cluster_of(self.state, assignments[0].node) in barred
        finally:
            self.ledger.rollback(mark)

    def try_place(
        self,
        job: JobRequest,
        flavor: str,
        replicas: Sequence[int],
        *,
        avoid_reserved: bool,
        elastic: bool = False,
        beside: str | None = None,
    ) -> tuple[ReplicaAssignment, ...] | None:
        """Quota, then placement (in the cluster of node `beside` if given); on success both
        state and ledger hold the replicas."""
        milli = job.resources.gpu_milli * len(replicas)
        if self.quota_verdict(job, flavor, milli) is not None:
            return None
        placed = self.placer.place_gang(
            job, flavor, replicas, avoid_reserved=avoid_reserved, elastic=elastic, beside=beside
        )
        if placed is not None and self.counts_against_quota(job):
            self.ledger.charge(job.tenant, job.user, flavor, milli)
            pinned.charge(self.ledger, self.state, job, flavor, placed, +1)
        return placed

    def try_place_any(
        self,
        job: JobRequest,
        flavors: Sequence[str],
        replicas: Sequence[int],
        *,
        avoid_reserved: bool,
    ) -> tuple[str, tuple[ReplicaAssignment, ...]] | None:
        """``try_place`` over the flavors whose quota admits the gang, best node first."""
        milli = job.resources.gpu_milli * len(replicas)
        allowed = [f for f in flavors if self.quota_verdict(job, f, milli) is None]
        if not allowed:
            return None
        found = self.placer.place_gang_any(job, allowed, replicas, avoid_reserved=avoid_reserved)
        if found is not None and self.counts_against_quota(job):
            self.ledger.charge(job.tenant, job.user, found[0], milli)
            pinned.charge(self.ledger, self.state, job, found[0], found[1], +1)
        return found
