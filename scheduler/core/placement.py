"""Gang placement on the tentative state: filter, score, commit all replicas or none.

Filters (one numpy pass over the nodes per replica): flavor, pools, node health and cordon,
taints (static, cached per cycle); then free whole GPUs on one node, or one device with the
share and its GPU memory free; CPU, memory, RDMA, and for a job without GPUs the part of
a node's CPU and memory such jobs may hold (``ClusterState.cpu_only_cpu``). Reserved devices
are invisible to jobs that would delay the reservation (``avoid_reserved``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from scheduler.core.scoring import GpuFit, ScoreInput, Scorer
from scheduler.core.tentative import BoolArray, ClusterState, IntArray
from scheduler.core.types import (
    MILLI_PER_GPU,
    DeviceShare,
    JobRequest,
    ReplicaAssignment,
    Resources,
)


@dataclass(slots=True)
class Placer:
    """Places replicas with the cycle's weighted scoring plugins, made by ``make_scorers``
    when a replica is first scored: a cycle whose jobs all wait on quota or find no
    feasible node never pays for them (the fragmentation model and the request mix)."""

    state: ClusterState
    make_scorers: Callable[[], Sequence[tuple[Scorer, float]]]
    max_scored: int
    # The nodes a job's quotas pinned per cluster leave it for ``milli`` on a flavor (None:
    # all); set by the cycle (``CycleContext.pinned_mask``), read afresh at every placement.
    narrow: Callable[[JobRequest, str, int], BoolArray | None] | None = None
    _scorers: Sequence[tuple[Scorer, float]] | None = field(default=None, init=False)

    @property
    def scorers(self) -> Sequence[tuple[Scorer, float]]:
        if self._scorers is None:
            self._scorers = self.make_scorers()
        return self._scorers

    def place_gang(
        self,
        job: JobRequest,
        flavor: str,
        replicas: Sequence[int],
        *,
        avoid_reserved: bool,
        elastic: bool = False,
        beside: str | None = None,
    ) -> tuple[ReplicaAssignment, ...] | None:
        """Place every replica in ``replicas`` on ``flavor`` or none: on failure the state is
        rolled back and None returned; on success the state keeps the allocations.
        ``beside``: a node the job already holds; the replicas go to its cluster (a job's
        elastic extras join its gang's cluster)."""
        found = self._gang(job, (flavor,), replicas, avoid_reserved, elastic, beside)
        return None if found is None else found[1]

    def place_gang_any(
        self,
        job: JobRequest,
        flavors: Sequence[str],
        replicas: Sequence[int],
        *,
        avoid_reserved: bool,
    ) -> tuple[str, tuple[ReplicaAssignment, ...]] | None:
        """As ``place_gang``, choosing among ``flavors``: the first replica goes to the best
        node of any of them and the gang stays on that node's flavor (a gang never mixes GPU
        models). If that gang fails, each flavor is tried alone, in order."""
        found = self._gang(job, tuple(flavors), replicas, avoid_reserved, False, None)
        if found is None and len(flavors) > 1:
            for flavor in flavors:
                found = self._gang(job, (flavor,), replicas, avoid_reserved, False, None)
                if found is not None:
                    break
        return found

    def fits_one(self, job: JobRequest, flavor: str, *, avoid_reserved: bool) -> bool:
        """Whether one replica of ``job`` would be placed on ``flavor`` now: where any node
        is feasible, placement takes the best-scored one, so no scoring is needed here."""
        static = self._static(job, (flavor,), job.resources.gpu_milli)
        return len(self.feasible(job, static, avoid_reserved)) > 0

    def _gang(
        self,
        job: JobRequest,
        flavors: tuple[str, ...],
        replicas: Sequence[int],
        avoid_reserved: bool,
        elastic: bool,
        beside: str | None,
    ) -> tuple[str, tuple[ReplicaAssignment, ...]] | None:
        """A gang never spans two clusters (values of ``gantry.io/cluster``): the first
        replica goes to the best node of any cluster and the gang stays in that node's
        cluster, as it stays on its flavor. If that gang fails and the candidates span
        several clusters, each is tried alone: the preferred ones first, then the most free
        GPUs of the candidates first (skipping one with too few in total)."""
        state = self.state
        static = self._static(job, flavors, job.resources.gpu_milli * len(replicas))
        if beside is not None and beside in state.index:
            static = static & state.cluster_mask(int(state.cluster[state.index[beside]]))
        found = self._gang_in(job, flavors, replicas, avoid_reserved, elastic, static)
        if found is not None or len(replicas) == 1 or not state.several_clusters:
            return found
        codes = np.unique(state.cluster[static])
        if len(codes) < 2:
            return None
        need = job.resources.gpu_milli * len(replicas)
        free = {
            int(c): int(state.node_free[static & state.cluster_mask(int(c))].sum()) for c in codes
        }
        preferred = state.cluster_codes(job.preferred_clusters)
        for code in sorted(free, key=lambda c: (c not in preferred, -free[c], c)):
            if free[code] < need:
                continue
            within = static & state.cluster_mask(code)
            found = self._gang_in(job, flavors, replicas, avoid_reserved, elastic, within)
            if found is not None:
                return found
        return None

    def _gang_in(
        self,
        job: JobRequest,
        flavors: tuple[str, ...],
        replicas: Sequence[int],
        avoid_reserved: bool,
        elastic: bool,
        static: BoolArray,
    ) -> tuple[str, tuple[ReplicaAssignment, ...]] | None:
        """The gang on the ``static`` candidates, on one flavor and one cluster, or None
        (the state rolled back)."""
        state, res = self.state, job.resources
        mark = state.mark()
        flavor = flavors[0] if len(flavors) == 1 else None
        out: list[ReplicaAssignment] = []
        placed: list[int] = []
        node = -1
        for position, replica in enumerate(replicas):
            if node < 0 or not self.fits_node(node, job, avoid_reserved):
                left = len(replicas) - position
                node = self._choose(job, flavor, static, placed, left, avoid_reserved)
                if node < 0:
                    state.rollback(mark)
                    return None
            if not placed:  # the first replica's node decides the flavor and the cluster
                if flavor is None:
                    flavor = state.nodes[node].flavor
                    static = static & (state.flavor == state.flavor_code(flavor))
                if len(replicas) > 1 and state.several_clusters:
                    static = static & state.cluster_mask(int(state.cluster[node]))
            shares = self._shares(node, job, avoid_reserved)
            state.apply(node, shares, res.cpu_milli, res.memory_mib, res.rdma, +1)
            out.append(ReplicaAssignment(replica, state.nodes[node].name, shares, elastic))
            placed.append(node)
        assert flavor is not None  # replicas is never empty
        return flavor, tuple(out)

    def usable(self, job: JobRequest, flavor: str, milli: int) -> BoolArray:
        """The nodes a placement of ``milli`` of ``job`` on ``flavor`` may use at all, free or
        not (its filters, required clusters and pinned quotas)."""
        return self._static(job, (flavor,), milli)

    def _static(self, job: JobRequest, flavors: tuple[str, ...], milli: int) -> BoolArray:
        masks = []
        for f in flavors:
            mask = self.state.static_mask(f, job.pools, job.tolerations, job.clusters, job.regions)
            narrowed = None if self.narrow is None else self.narrow(job, f, milli)
            masks.append(mask if narrowed is None else mask & narrowed)
        return masks[0] if len(masks) == 1 else np.logical_or.reduce(masks)

    def feasible(self, job: JobRequest, static: BoolArray, avoid_reserved: bool) -> IntArray:
        """Indices of nodes where one replica of ``job`` fits now."""
        state, res = self.state, job.resources
        mask = static
        if res.whole_gpus:
            avail = state.whole_free
            if avoid_reserved:
                avail = avail - state.reserved_whole_free
            mask = mask & (avail >= res.whole_gpus)
        elif res.is_shared:
            mask = mask & self._device_mask(job, avoid_reserved).any(axis=1)
        else:  # no GPU: within what a node leaves to jobs without GPUs
            if res.cpu_milli:
                mask = mask & (state.cpu_only_cpu >= res.cpu_milli)
            if res.memory_mib:
                mask = mask & (state.cpu_only_mem >= res.memory_mib)
        if res.cpu_milli:
            mask = mask & (state.cpu_free >= res.cpu_milli)
        if res.memory_mib:
            mask = mask & (state.mem_free >= res.memory_mib)
        if res.rdma:
            mask = mask & (state.rdma_free >= res.rdma)
        return np.flatnonzero(mask)

    def _device_mask(self, job: JobRequest, avoid_reserved: bool) -> BoolArray:
        state, res = self.state, job.resources
        mask = (
            state.usable & (state.dev_free >= res.gpu_milli) & (state.dev_mem >= res.gpu_memory_mib)
        )
        return mask & ~state.reserved if avoid_reserved else mask

    def _choose(
        self,
        job: JobRequest,
        flavor: str | None,
        static: BoolArray,
        placed: list[int],
        remaining: int,
        avoid_reserved: bool,
    ) -> int:
        """The best node for one replica, or -1. A lone whole-GPU replica takes its
        candidates from the free-count buckets (O(max_scored), not O(nodes)); gangs and
        shares filter every node, since topology and devices need the whole picture."""
        lone = job.resources.whole_gpus and remaining == 1 and not placed
        if job.preferred_clusters and not placed:
            nodes = self._preferred(job, self.feasible(job, static, avoid_reserved))
        elif lone and flavor is not None and not avoid_reserved:
            nodes = self._bucket_candidates(job, flavor, static)
        else:
            nodes = self.feasible(job, static, avoid_reserved)
        if len(nodes) == 0:
            return -1
        devices = self._best_devices(job, nodes, avoid_reserved)
        inp = ScoreInput(
            self.state,
            nodes,
            devices,
            job.resources,
            job.flavors,
            placed,
            remaining,
            avoid_reserved,
        )
        if len(nodes) > self.max_scored:
            inp = self._shortlist(inp)
        total = np.zeros(len(inp.nodes))
        for scorer, weight in self.scorers:
            total += weight * scorer.score(inp)
        return int(inp.nodes[int(np.argmax(total))])

    def _preferred(self, job: JobRequest, nodes: IntArray) -> IntArray:
        """The candidates in the job's preferred clusters when there are any, else all: a
        preference decides before any score (a soft requirement), so a shortlist of the best
        fitting nodes cannot drop it."""
        state = self.state
        mine = nodes[np.isin(state.cluster[nodes], state.cluster_codes(job.preferred_clusters))]
        return mine if len(mine) else nodes

    def _bucket_candidates(self, job: JobRequest, flavor: str, static: BoolArray) -> IntArray:
        """Up to ``max_scored`` feasible nodes, fewest whole free GPUs first (best fit), in
        node order within a count: the same shortlist ``_shortlist`` would keep."""
        state, res = self.state, job.resources
        code, need = state.flavor_code(flavor), self.max_scored
        found: list[IntArray] = []
        for count in range(res.whole_gpus, state.max_devices + 1):
            bucket = state.buckets.get((code, count), [])
            start = 0
            while need > 0 and start < len(bucket):
                chunk = np.array(bucket[start : start + 2 * need], dtype=np.int64)
                start += len(chunk)
                good = chunk[self._room(chunk, res, static)][:need]
                found.append(good)
                need -= len(good)
            if need == 0:
                break
        return np.concatenate(found) if found else np.zeros(0, dtype=np.int64)

    def _room(self, nodes: IntArray, res: Resources, static: BoolArray) -> BoolArray:
        state = self.state
        ok = static[nodes]
        if res.cpu_milli:
            ok &= state.cpu_free[nodes] >= res.cpu_milli
        if res.memory_mib:
            ok &= state.mem_free[nodes] >= res.memory_mib
        if res.rdma:
            ok &= state.rdma_free[nodes] >= res.rdma
        return np.asarray(ok, dtype=np.bool_)

    def _shortlist(self, inp: ScoreInput) -> ScoreInput:
        """The ``max_scored`` best-fitting candidates, in node order among equals."""
        # Ties keep node order: the index term is far below one fit step (1/8000).
        key = -GpuFit().score(inp) + np.arange(len(inp.nodes)) * 1e-10
        keep = np.sort(np.argpartition(key, self.max_scored - 1)[: self.max_scored])
        devices = None if inp.devices is None else inp.devices[keep]
        return ScoreInput(
            inp.state,
            inp.nodes[keep],
            devices,
            inp.resources,
            inp.flavors,
            inp.placed,
            inp.remaining,
            inp.avoid_reserved,
        )

    def _best_devices(
        self, job: JobRequest, nodes: IntArray, avoid_reserved: bool
    ) -> IntArray | None:
        """For a share: on each node, the fitting device with the least free (best fit)."""
        if not job.resources.is_shared:
            return None
        ok = self._device_mask(job, avoid_reserved)[nodes]
        free = np.where(ok, self.state.dev_free[nodes], 2 * MILLI_PER_GPU)
        return np.asarray(np.argmin(free, axis=1), dtype=np.int64)

    def fits_node(self, i: int, job: JobRequest, avoid_reserved: bool) -> bool:
        """Whether one more replica fits on node ``i`` (already past the static filters)."""
        state, res = self.state, job.resources
        if (
            res.cpu_milli > state.cpu_free[i]
            or res.memory_mib > state.mem_free[i]
            or res.rdma > state.rdma_free[i]
        ):
            return False
        if res.whole_gpus:
            avail = state.whole_free[i] - (state.reserved_whole_free[i] if avoid_reserved else 0)
            return bool(avail >= res.whole_gpus)
        if res.is_shared:
            return bool(self._device_row(i, job, avoid_reserved).any())
        return bool(
            res.cpu_milli <= state.cpu_only_cpu[i] and res.memory_mib <= state.cpu_only_mem[i]
        )

    def _device_row(self, i: int, job: JobRequest, avoid_reserved: bool) -> BoolArray:
        state, res = self.state, job.resources
        row = (
            state.usable[i]
            & (state.dev_free[i] >= res.gpu_milli)
            & (state.dev_mem[i] >= res.gpu_memory_mib)
        )
        return np.asarray(row & ~state.reserved[i] if avoid_reserved else row, dtype=np.bool_)

    def _shares(self, i: int, job: JobRequest, avoid_reserved: bool) -> tuple[DeviceShare, ...]:
        state, res = self.state, job.resources
        if res.is_shared:
            ok = self._device_row(i, job, avoid_reserved)
            free = np.where(ok, state.dev_free[i], 2 * MILLI_PER_GPU)
            d = int(np.argmin(free))
            return (DeviceShare(d, res.gpu_milli, res.gpu_memory_mib),)
        if not res.whole_gpus:
            return ()
        full = state.usable[i] & (state.dev_free[i] == MILLI_PER_GPU)
        if avoid_reserved:
            full &= ~state.reserved[i]
        picked = np.flatnonzero(full)[: res.whole_gpus]
        return tuple(DeviceShare(int(d), MILLI_PER_GPU, int(state.dev_mem[i, d])) for d in picked)
