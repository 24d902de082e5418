"""Quota admission up the tenant tree (kueue's cohorts, made hierarchical).

Per flavor, every tenant n has an effective guarantee ``g(n)`` (its own, or the sum of its
children's when it sets none), an optional ``limit`` and a ``lend_limit`` (default: all of
``g``). A tenant reserves ``g - lend_limit`` for itself and pools the rest with its siblings.
A request of ``r`` milli-GPU by leaf t fits when, for t and each ancestor n:

- ``u(n) + r <= limit(n)``, and
- the siblings under n's parent p still fit p:  ``sum_c max(u(c), g(c) - lend(c)) <= g(p)``.

Using up to ``g(n)`` never borrows; beyond it, usage comes out of what siblings leave idle
(the second rule), which is the promise "beyond guarantee only from idle capacity".
Best-effort classes are not charged. Usage is milli-GPU of running and admitted jobs.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from scheduler.core.types import MILLI_PER_GPU, Tenant

_Key = tuple[str, str]  # (tenant, flavor)


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
        self.user_usage: dict[tuple[str, str], int] = defaultdict(int)
        self._pooled: dict[_Key, int] = defaultdict(int)  # sum_c max(u, g - lend) per parent
        self._guarantee: dict[_Key, int] = {}
        self._journal: list[tuple[str, str, str, int]] = []
        self._init_pools(flavors)

    def _chain(self, name: str) -> tuple[str, ...]:
        out: list[str] = []
        node: str | None = name
        while node is not None and node in self.tenants and node not in out:
            out.append(node)
            node = self.tenants[node].parent
        return tuple(out)

    def guarantee(self, tenant: str, flavor: str) -> int:
        key = (tenant, flavor)
        if key not in self._guarantee:
            quota = self.tenants[tenant].quotas.get(flavor)
            self._guarantee[key] = (
                quota.guaranteed
                if quota is not None
                else sum(self.guarantee(c, flavor) for c in self.children[tenant])
            )
        return self._guarantee[key]

    def _own_reserve(self, tenant: str, flavor: str) -> int:
        quota = self.tenants[tenant].quotas.get(flavor)
        lend = None if quota is None else quota.lend_limit
        g = self.guarantee(tenant, flavor)
        return 0 if lend is None else max(0, g - lend)

    def _pool_share(self, tenant: str, flavor: str, usage: int) -> int:
        return max(usage, self._own_reserve(tenant, flavor))

    # -- checks ---------------------------------------------------------------------------

    def check(self, tenant: str, user: str, flavor: str, milli: int) -> QuotaVerdict | None:
        """None when ``milli`` more of ``flavor`` fits for ``tenant``; else the first rule
        that fails, from the leaf upwards."""
        cap = self.tenants[tenant].max_gpu_milli_per_user
        used_by_user = self.user_usage[(tenant, user)]
        if cap is not None and user and used_by_user + milli > cap:
            return QuotaVerdict(
                tenant,
                f"user cap: {user} uses {gpus(used_by_user)} GPUs in {tenant}, "
                f"cap {gpus(cap)}, job needs {gpus(milli)}",
                user_cap=True,
            )
        for node in self.chain[tenant]:
            verdict = self._check_node(node, flavor, milli)
            if verdict is not None:
                return verdict
        return None

    def _check_node(self, node: str, flavor: str, milli: int) -> QuotaVerdict | None:
        used, g = self.usage[(node, flavor)], self.guarantee(node, flavor)
        quota = self.tenants[node].quotas.get(flavor)
        if quota is not None and quota.limit is not None and used + milli > quota.limit:
            return QuotaVerdict(
                node,
                f"quota: {node} uses {gpus(used)}/{gpus(g)} {flavor}, "
                f"limit {gpus(quota.limit)}; job needs {gpus(milli)}",
            )
        parent = self.tenants[node].parent
        if parent is None or parent not in self.tenants:
            return None
        before = self._pool_share(node, flavor, used)
        after = self._pool_share(node, flavor, used + milli)
        pooled = self._pooled[(parent, flavor)] + after - before
        capacity = self.guarantee(parent, flavor)
        if pooled <= capacity:
            return None
        idle = max(0, capacity - self._pooled[(parent, flavor)])
        return QuotaVerdict(
            node,
            f"quota: {node} uses {gpus(used)}/{gpus(g)} {flavor}; job needs {gpus(milli)} "
            f"but cohort {parent} has {gpus(idle)} {flavor} idle to lend",
        )

    def borrowing(self, tenant: str, flavor: str) -> int:
        """Milli-GPU the tenant uses beyond its guarantee (0 when within)."""
        return max(0, self.usage[(tenant, flavor)] - self.guarantee(tenant, flavor))

    def within_guarantee_after(self, tenant: str, flavor: str, milli: int) -> bool:
        return self.usage[(tenant, flavor)] + milli <= self.guarantee(tenant, flavor)

    # -- changes --------------------------------------------------------------------------

    def charge(self, tenant: str, user: str, flavor: str, milli: int) -> None:
        """Add (or with negative ``milli`` refund) usage up the chain; journaled."""
        self._charge(tenant, user, flavor, milli)
        self._journal.append((tenant, user, flavor, milli))

    def _charge(self, tenant: str, user: str, flavor: str, milli: int) -> None:
        self.user_usage[(tenant, user)] += milli
        for node in self.chain.get(tenant, ()):
            key = (node, flavor)
            before = self._pool_share(node, flavor, self.usage[key])
            self.usage[key] += milli
            parent = self.tenants[node].parent
            if parent is not None:
                after = self._pool_share(node, flavor, self.usage[key])
                self._pooled[(parent, flavor)] += after - before

    def _init_pools(self, flavors: Iterable[str]) -> None:
        """Seed each cohort's pooled sum with the members' own reserves (zero usage)."""
        for flavor in flavors:
            for name, tenant in self.tenants.items():
                if tenant.parent is not None:
                    self._pooled[(tenant.parent, flavor)] += self._own_reserve(name, flavor)

    def mark(self) -> int:
        return len(self._journal)

    def rollback(self, mark: int) -> None:
        while len(self._journal) > mark:
            tenant, user, flavor, milli = self._journal.pop()
            self._charge(tenant, user, flavor, -milli)
