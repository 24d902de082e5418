"""Quota admission up the tenant tree (kueue's hierarchical cohorts).

Per flavor, every tenant n has an effective guarantee ``g(n)`` (its own, or the sum of its
children's when it sets none), an optional ``limit`` and a ``lend_limit`` (default: all of
``g``). The part ``g - lend_limit`` is n's reserve: nobody else may use it even when idle.
A tenant without quota on a flavor may run there by borrowing only, as a Kueue ClusterQueue
with nominalQuota 0: below a parent without quota nothing is guaranteed (``_backed``), and
only a root without quota is a cohort whose capacity is its children's guarantees.
A node's footprint is what it denies the rest of the tree:

    eff(n) = max(usage of n's own jobs + sum of eff(children), g(n) - lend_limit(n))

A request of ``r`` milli-GPU by tenant t fits when ``u(n) + r <= limit(n)`` for t and each
ancestor n, and the root's footprint after it stays within the root's guarantee. Usage up to
``g(t)`` never borrows; beyond it, it comes out of what the rest of the tree leaves idle and
does not reserve: the promise "beyond guarantee only from idle capacity". Best-effort
classes are not charged. Usage is milli-GPU of running and admitted jobs.

Quotas pinned to a cluster (``Tenant.pinned``, keyed ``pinned_key(flavor, cluster)``) are
charged on the same ledger under their own keys, by the use of the flavor on that cluster's
nodes; only their limits and guarantees are read there (``scheduler.core.pinned``), never
the cohort. A tenant that pins a flavor but sets no global quota on it holds, globally, the
sum of its pinned ones (``_own``): pinned guarantees count inside the global one.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TypeVar

from scheduler.core.types import MILLI_PER_GPU, JobRequest, Quota, RunningJob, Tenant

_Key = tuple[str, str]  # (tenant, flavor)
T = TypeVar("T", bound=Hashable)

# Separates a flavor from a cluster in a pinned quota's key: in neither a flavor's name nor a
# cluster's (a DNS label).
PIN = "@"


def pinned_key(flavor: str, cluster: str) -> str:
    """The ledger's key of ``flavor`` on ``cluster``'s nodes: ``H100@site-b``."""
    return f"{flavor}{PIN}{cluster}"


def implied_global(pinned: dict[str, Quota] | Mapping[str, Quota], flavor: str) -> Quota | None:
    """The global quota of a tenant that pins ``flavor`` and sets no global quota on it: the
    sums of its pinned guarantees and limits; None when it pins none."""
    mine = [q for key, q in pinned.items() if key.partition(PIN)[0] == flavor]
    if not mine:
        return None
    limits = [q.limit for q in mine]
    limit = None if None in limits else sum(x for x in limits if x is not None)
    return Quota(sum(q.guaranteed for q in mine), limit)


def subtree_usage(
    claims: Iterable[tuple[T, str, int]], chain: Callable[[T], Iterable[T]]
) -> dict[tuple[T, str], int]:
    """Usage per (tenant, flavor), the one definition every reader of quota use shares: each
    claim ``(tenant, flavor, milli-GPU)`` counts for its tenant and for every ancestor
    (``chain(tenant)``: the tenant, then up to its root), so a tenant's usage is its
    subtree's. The ledger charges by the same rule, one change at a time (``charge``); the
    database's readers (`scheduler.snapshot.quota_usage`) feed this from the allocations."""
    used: dict[tuple[T, str], int] = defaultdict(int)
    for tenant, flavor, milli in claims:
        for node in chain(tenant):
            used[(node, flavor)] += milli
    return dict(used)


def running_claims(
    running: Iterable[RunningJob], counts_against_quota: Callable[[JobRequest], bool]
) -> list[tuple[str, str, int]]:
    """What running jobs charge: each job that counts against quota, on its allocation's
    flavor, the milli-GPU of its replicas (as ``CycleContext.hold`` charges them)."""
    return [(r.job.tenant, r.flavor, r.gpu_milli) for r in running if counts_against_quota(r.job)]


def gpus(milli: int) -> str:
    """Milli-GPU as a person reads it: ``16`` or ``2.5``."""
    return f"{milli / MILLI_PER_GPU:g}"


@dataclass(frozen=True, slots=True)
class QuotaVerdict:
    """Why a request does not fit; ``tenant`` is the tree node whose rule failed."""

    tenant: str
    message: str
    user_cap: bool = False


class QuotaLedger:
    """Usage per tenant (subtree) and flavor, charged and refunded with an undo journal."""

    def __init__(self, tenants: Sequence[Tenant], flavors: Iterable[str]) -> None:
        self.tenants = {t.name: t for t in tenants}
        self.children: dict[str | None, list[str]] = defaultdict(list)
        for t in tenants:
            self.children[t.parent].append(t.name)
        self.chain = {name: self._chain(name) for name in self.tenants}
        self.usage: dict[_Key, int] = defaultdict(int)
        self.user_usage: dict[tuple[str, str, str], int] = defaultdict(int)  # tenant, user, flavor
        self._inner: dict[_Key, int] = defaultdict(int)  # own usage + children's footprints
        self._eff: dict[_Key, int] = defaultdict(int)  # max(inner, reserve)
        self._guarantee: dict[_Key, int] = {}
        self._reserves: dict[_Key, int] = {}
        self._journal: list[tuple[str, str, str, int]] = []
        self.changes = 0  # bumped by every charge and refund: a version for caches
        # flavor -> {cluster: key} of every cluster some tenant pins the flavor to
        self.pinned: dict[str, dict[str, str]] = defaultdict(dict)
        for t in tenants:
            for key in t.pinned:
                flavor, _, cluster = key.partition(PIN)
                self.pinned[flavor][cluster] = key
        self._quotas: dict[_Key, Quota | None] = {}
        # (tenant, flavor) -> the pinned quotas on its chain: see ``pins``
        self._pins: dict[_Key, tuple[tuple[str, str, Quota], ...]] = {}
        self._init_footprints(flavors)

    def pins(self, tenant: str, flavor: str) -> tuple[tuple[str, str, Quota], ...]:
        """(tree node, cluster, quota) of every quota pinning ``flavor`` on ``tenant``'s
        chain, the tenant's own first: empty for most tenants, which then skip every
        per-cluster rule."""
        kept = self._pins.get((tenant, flavor))
        if kept is None:
            clusters = self.pinned.get(flavor, {})
            kept = self._pins[(tenant, flavor)] = tuple(
                (node, cluster, quota)
                for node in self.chain[tenant]
                for cluster, key in sorted(clusters.items())
                if (quota := self.tenants[node].pinned.get(key)) is not None
            )
        return kept

    def _own(self, tenant: str, key: str) -> Quota | None:
        """The tenant's own quota under ``key``: global (a flavor) or pinned (``pinned_key``),
        a global one implied by its pinned ones when it sets none."""
        cache = (tenant, key)
        if cache not in self._quotas:
            t = self.tenants[tenant]
            found = t.quotas.get(key) or t.pinned.get(key)
            if found is None and PIN not in key and t.pinned:
                found = implied_global(t.pinned, key)
            self._quotas[cache] = found
        return self._quotas[cache]

    def _chain(self, name: str) -> tuple[str, ...]:
        out: list[str] = []
        node: str | None = name
        while node is not None and node in self.tenants and node not in out:
            out.append(node)
            node = self.tenants[node].parent
        return tuple(out)

    def guarantee(self, tenant: str, flavor: str) -> int:
        key = (tenant, flavor)
        kept = self._guarantee.get(key)
        if kept is None:
            quota = self._own(tenant, flavor)
            if quota is not None:
                pinned = PIN in flavor  # a cluster's part of a guarantee carved out above
                kept = quota.guaranteed if pinned or self._backed(tenant, flavor) else 0
            else:
                kept = sum(self.guarantee(c, flavor) for c in self.children[tenant])
            self._guarantee[key] = kept
        return kept

    def _backed(self, tenant: str, flavor: str) -> bool:
        """Whether the tenant's guarantee is carved out of its parent's: the parent holds a
        quota on the flavor that is backed in turn, or is a root without one (a cohort, whose
        capacity is its children's guarantees). Below a tenant without quota there is
        nothing to guarantee (``tenants.quotas.rules`` refuses such a quota): a row left there
        from before keeps its limit but borrows like its parent."""
        parent = self.tenants[tenant].parent
        if parent is None or parent not in self.tenants:
            return True
        if self._own(parent, flavor) is not None:
            return self._backed(parent, flavor)
        return self.tenants[parent].parent is None

    def _reserve(self, tenant: str, flavor: str) -> int:
        key = (tenant, flavor)
        kept = self._reserves.get(key)
        if kept is None:
            quota = self._own(tenant, flavor)
            lend = None if quota is None else quota.lend_limit
            kept = self._reserves[key] = (
                0 if lend is None else max(0, self.guarantee(tenant, flavor) - lend)
            )
        return kept

    def _footprints(self, tenant: str, flavor: str, milli: int) -> list[int]:
        """eff(n) along ``chain[tenant]`` if ``tenant`` used ``milli`` more."""
        out: list[int] = []
        delta = milli
        for node in self.chain[tenant]:
            key = (node, flavor)
            inner = self._inner[key] + delta
            new = max(inner, self._reserve(node, flavor))
            delta = new - self._eff[key]
            out.append(new)
        return out

    # -- checks ---------------------------------------------------------------------------

    def check(self, tenant: str, user: str, flavor: str, milli: int) -> QuotaVerdict | None:
        """None when ``milli`` more of ``flavor`` fits for ``tenant``; else the first rule
        that fails, from the leaf upwards."""
        cap = self.tenants[tenant].user_caps.get(flavor)
        used_by_user = self.user_usage[(tenant, user, flavor)]
        if cap is not None and user and used_by_user + milli > cap:
            return QuotaVerdict(
                tenant,
                f"user cap: {user} uses {gpus(used_by_user)} {flavor} in {tenant}, "
                f"cap {gpus(cap)}, job needs {gpus(milli)}",
                user_cap=True,
            )
        for node in self.chain[tenant]:
            verdict = self._check_limit(node, flavor, milli)
            if verdict is not None:
                return verdict
        root = self.chain[tenant][-1]
        capacity = self.guarantee(root, flavor)
        if self._footprints(tenant, flavor, milli)[-1] <= capacity:
            return None
        used, g = self.usage[(tenant, flavor)], self.guarantee(tenant, flavor)
        idle = max(0, capacity - self._eff[(root, flavor)])
        holds = (
            f"has {gpus(used)} {flavor} in use against a guarantee of {gpus(g)}"
            if g
            else f"holds no {flavor} guarantee and may only borrow"
        )
        return QuotaVerdict(
            tenant,
            f"quota: {tenant} {holds}; this job needs {gpus(milli)}, and only {gpus(idle)} "
            f"{flavor} of other teams' guarantees is idle to lend",
        )

    def _check_limit(self, node: str, flavor: str, milli: int) -> QuotaVerdict | None:
        quota = self._own(node, flavor)
        used = self.usage[(node, flavor)]
        if quota is None or quota.limit is None or used + milli <= quota.limit:
            return None
        g = self.guarantee(node, flavor)
        return QuotaVerdict(
            node,
            f"quota: {node} has {gpus(used)} of its {flavor} limit of {gpus(quota.limit)} in use "
            f"({gpus(g)} guaranteed); this job needs {gpus(milli)}",
        )

    def borrowing(self, tenant: str, flavor: str, leaving: Mapping[_Key, int] | None = None) -> int:
        """Milli-GPU the tenant uses beyond its guarantee (0 when within); with `leaving`, not
        counting what its jobs already giving their devices back hold (a preempted job whose
        pods are stopping)."""
        gone = leaving.get((tenant, flavor), 0) if leaving else 0
        return max(0, self.usage[(tenant, flavor)] - gone - self.guarantee(tenant, flavor))

    def branch_toward(self, tenant: str, claimant: str) -> str:
        """The ancestor of ``tenant`` (itself, or higher) just below its lowest common ancestor
        with ``claimant``: where the two meet, what ``tenant`` borrows of ``claimant``'s side
        is what that branch uses beyond its guarantee. A team borrowing only its own
        cohort's unused guarantees borrows nothing from another cohort."""
        theirs = set(self.chain.get(claimant, ()))
        branch = tenant
        for node in self.chain.get(tenant, (tenant,)):
            if node in theirs:
                return branch
            branch = node
        return branch

    def borrowing_from(
        self, tenant: str, claimant: str, flavor: str, leaving: Mapping[_Key, int] | None = None
    ) -> int:
        """Milli-GPU ``claimant`` may reclaim of what ``tenant`` borrows: what it borrows, at
        most what its branch toward ``claimant`` borrows (``branch_toward``); `leaving` as
        for ``borrowing``."""
        return self.borrowing_within(tenant, self.branch_toward(tenant, claimant), flavor, leaving)

    def borrowing_within(
        self, tenant: str, branch: str, flavor: str, leaving: Mapping[_Key, int] | None = None
    ) -> int:
        """What ``tenant`` borrows, at most what its ancestor ``branch`` borrows (``branch``
        the tenant itself: what it borrows); `leaving` as for ``borrowing``."""
        own = self.borrowing(tenant, flavor, leaving)
        return own if branch == tenant else min(own, self.borrowing(branch, flavor, leaving))

    def within_guarantee_after(self, tenant: str, flavor: str, milli: int) -> bool:
        return self.usage[(tenant, flavor)] + milli <= self.guarantee(tenant, flavor)

    def borrows_on_all(self, tenant: str, flavors: Iterable[str], milli: int) -> bool:
        """Whether ``milli`` more would take ``tenant`` beyond its guarantee on every one of
        ``flavors`` (``within_guarantee_after`` on none; one call for all of them: the
        queue asks it of every head)."""
        usage = self.usage
        for flavor in flavors:
            if usage[(tenant, flavor)] + milli <= self.guarantee(tenant, flavor):
                return False
        return True

    # -- changes --------------------------------------------------------------------------

    def charge(self, tenant: str, user: str, flavor: str, milli: int) -> None:
        """Add (or with negative ``milli`` refund) usage up the chain; journaled."""
        self._charge(tenant, user, flavor, milli)
        self._journal.append((tenant, user, flavor, milli))

    def _charge(self, tenant: str, user: str, flavor: str, milli: int) -> None:
        """`_footprints` and their writing in one pass (every trial placement, victim and
        rollback comes here)."""
        self.changes += 1
        self.user_usage[(tenant, user, flavor)] += milli
        usage, inner, eff, reserves = self.usage, self._inner, self._eff, self._reserves
        delta = milli
        for node in self.chain[tenant]:
            key = (node, flavor)
            usage[key] += milli
            now = inner[key] + delta
            inner[key] = now
            floor = reserves.get(key)
            if floor is None:
                floor = self._reserve(node, flavor)
            new = now if now > floor else floor
            delta = new - eff[key]
            eff[key] = new

    def _init_footprints(self, flavors: Iterable[str]) -> None:
        """With nothing charged, every footprint is the reserves below it (or its own)."""
        for flavor in flavors:
            for name in self._bottom_up():
                key = (name, flavor)
                self._inner[key] = sum(self._eff[(c, flavor)] for c in self.children[name])
                self._eff[key] = max(self._inner[key], self._reserve(name, flavor))

    def _bottom_up(self) -> list[str]:
        return sorted(self.tenants, key=lambda name: -len(self.chain[name]))

    def mark(self) -> int:
        return len(self._journal)

    def commit(self) -> None:
        """Keep every charge so far: the journal starts again from here (mark 0)."""
        self._journal.clear()

    def rollback(self, mark: int) -> None:
        while len(self._journal) > mark:
            tenant, user, flavor, milli = self._journal.pop()
            self._charge(tenant, user, flavor, -milli)
