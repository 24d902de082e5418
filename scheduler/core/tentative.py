"""The tentative cluster state of one cycle: numpy arrays plus an undo journal.

Every change goes through ``apply`` and is journaled, so a gang, a preemption trial or a
backfill probe can be tried and rolled back exactly (volcano's ``Statement``): take
``mark()``, change things, then ``rollback(mark)`` or keep them.

Arrays are indexed ``[node]`` or ``[node, device]`` in the snapshot's node order, which is
also the tie-break order of scoring (ties go to the earliest node, which packs).
"""

from __future__ import annotations

from bisect import bisect_left, insort
from collections import defaultdict
from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

from scheduler.core.clusters import CLUSTER_LABEL, REGION_LABEL
from scheduler.core.fit import Capacity, Misfit, cpu_only_room, misfit_in_one_cluster
from scheduler.core.types import MILLI_PER_GPU, DeviceShare, Node, Resources, Taint, Toleration

IntArray = npt.NDArray[np.int64]
BoolArray = npt.NDArray[np.bool_]
_Entry = tuple[int, tuple[DeviceShare, ...], int, int, int, int]


def _codes(values: Sequence[str]) -> tuple[IntArray, list[str]]:
    """Integer codes for labels, -1 for the empty label."""
    names = sorted({v for v in values if v})
    lookup = {v: i for i, v in enumerate(names)}
    return np.array([lookup.get(v, -1) for v in values], dtype=np.int64), names


def _known(names: list[str], wanted: tuple[str, ...]) -> list[int]:
    """The codes of the ``wanted`` names that some node carries."""
    return [names.index(name) for name in wanted if name in names]


def _tolerated(taints: tuple[Taint, ...], tolerations: tuple[Toleration, ...]) -> bool:
    return all(
        t.effect == "PreferNoSchedule" or any(tol.tolerates(t) for tol in tolerations)
        for t in taints
    )


class ClusterState:
    """Free capacity per node and device, after the snapshot's running allocations.

    ``cpu_only_cpu`` and ``cpu_only_mem``: what jobs without GPUs may still take on each
    node, beside its free CPU and memory: on a node with GPUs they together hold at most
    ``cpu_only_share`` of its CPU and memory (``fit.cpu_only_room``), so they cannot strand
    its GPUs. A replica without device shares is such a job's."""

    def __init__(self, nodes: Sequence[Node], cpu_only_share: float = 1.0) -> None:
        self.nodes = tuple(nodes)
        self.cpu_only_share = cpu_only_share
        self.index = {node.name: i for i, node in enumerate(nodes)}
        n, d = len(nodes), max((len(node.devices) for node in nodes), default=1) or 1
        self.max_devices = d
        self.flavor, self.flavor_names = _codes([node.flavor for node in nodes])
        self.domain, _ = _codes([node.nvlink_domain for node in nodes])
        self.rack, _ = _codes([node.rack for node in nodes])
        self._load_devices(n, d)
        # Python copies of what never changes, for the per-node scalar code (apply, sign):
        # reading a numpy element costs more than a list's.
        self._flavor_of: list[int] = self.flavor.tolist()
        self._usable_rows: list[tuple[bool, ...]] = [tuple(row) for row in self.usable.tolist()]
        self._all_usable: list[bool] = [all(row) for row in self._usable_rows]
        self.schedulable = np.array([nd.healthy and not nd.cordoned for nd in nodes], np.bool_)
        self.pool, self.pool_names = _codes([node.pool for node in nodes])
        # A node's cluster and region (-1: unlabelled, itself one cluster).
        self.cluster, self.cluster_names = _codes([n.labels.get(CLUSTER_LABEL, "") for n in nodes])
        self.region, self.region_names = _codes([n.labels.get(REGION_LABEL, "") for n in nodes])
        self.several_clusters = len(np.unique(self.cluster)) > 1
        self._cluster_masks: dict[int, BoolArray] = {}
        groups = {taints: k for k, taints in enumerate(dict.fromkeys(n.taints for n in nodes))}
        self.taint_sets = list(groups)
        self.taint_group = np.array([groups[n.taints] for n in nodes], dtype=np.int64)
        self.cpu_free = np.array([node.cpu_milli for node in nodes], dtype=np.int64)
        self.mem_free = np.array([node.memory_mib for node in nodes], dtype=np.int64)
        self.rdma_free = np.array([node.rdma for node in nodes], dtype=np.int64)
        self.cpu_only_cpu, self.cpu_only_mem = cpu_only_room(self.nodes, cpu_only_share)
        self.reserved = np.zeros((n, d), dtype=np.bool_)
        self.whole_free = np.zeros(n, dtype=np.int64)
        self.reserved_whole_free = np.zeros(n, dtype=np.int64)
        self._recount()
        self.node_free = np.where(self.usable, self.dev_free, 0).sum(axis=1).astype(np.int64)
        self.flavor_free = self._flavor_free()
        # (flavor code, whole free devices) -> node indices, ascending: best fit, then order
        self.buckets: dict[tuple[int, int], list[int]] = defaultdict(list)
        for i in range(n):
            self.buckets[(int(self.flavor[i]), int(self.whole_free[i]))].append(i)
        self._journal: list[_Entry] = []
        self._signatures: dict[tuple[int, ...], int] = {}
        self._signature = [self._sign(i) for i in range(n)]
        self._unsigned: set[int] = set()  # nodes changed since their signature was taken
        self._static: dict[tuple[object, ...], BoolArray] = {}
        self._capacity: Capacity | None = None
        self._misfits: dict[tuple[object, ...], Misfit | None] = {}
        self.dirty: set[int] = set()

    def _load_devices(self, n: int, d: int) -> None:
        """Per-device arrays; a device is usable when it and its node are healthy and the
        node is not cordoned (running allocations on others still count)."""
        self.usable = np.zeros((n, d), dtype=np.bool_)
        self.dev_free = np.zeros((n, d), dtype=np.int64)
        self.dev_mem = np.zeros((n, d), dtype=np.int64)
        for i, node in enumerate(self.nodes):
            ok = node.healthy and not node.cordoned
            for dev in node.devices:
                self.usable[i, dev.index] = ok and dev.healthy
                self.dev_free[i, dev.index] = MILLI_PER_GPU
                self.dev_mem[i, dev.index] = dev.memory_mib

    def _recount(self) -> None:
        full = self.usable & (self.dev_free == MILLI_PER_GPU)
        self.whole_free = full.sum(axis=1).astype(np.int64)
        self.reserved_whole_free = (full & self.reserved).sum(axis=1).astype(np.int64)

    def _flavor_free(self) -> list[int]:
        free = np.where(self.usable, self.dev_free, 0).sum(axis=1)
        return [int(free[self.flavor == f].sum()) for f in range(len(self.flavor_names))]

    # -- changes --------------------------------------------------------------------------

    def apply(
        self, i: int, shares: tuple[DeviceShare, ...], cpu: int, mem: int, rdma: int, sign: int
    ) -> None:
        """Take (sign=+1) or give back (sign=-1) resources on node ``i``; journaled."""
        self._apply(i, shares, cpu, mem, rdma, sign)
        self._journal.append((i, shares, cpu, mem, rdma, sign))

    def _apply(
        self, i: int, shares: tuple[DeviceShare, ...], cpu: int, mem: int, rdma: int, sign: int
    ) -> None:
        free, flavor, usable = self.dev_free, self._flavor_of[i], self._usable_rows[i]
        moved = milli = 0  # whole free devices gained; usable milli-GPU taken
        for share in shares:
            d = share.device
            before = free.item(i, d)
            after = before - sign * share.milli
            free[i, d] = after
            if share.memory_mib:
                self.dev_mem[i, d] -= sign * share.memory_mib
            if usable[d]:
                turned = (after == MILLI_PER_GPU) - (before == MILLI_PER_GPU)
                if turned:
                    moved += turned
                    if self.reserved.item(i, d):
                        self.reserved_whole_free[i] += turned
                milli += share.milli
        if milli:
            self.flavor_free[flavor] -= sign * milli
            self.node_free[i] -= sign * milli
        if cpu:
            self.cpu_free[i] -= sign * cpu
        if mem:
            self.mem_free[i] -= sign * mem
        if rdma:
            self.rdma_free[i] -= sign * rdma
        if not shares:  # a job without GPUs: out of the share it may hold
            if cpu:
                self.cpu_only_cpu[i] -= sign * cpu
            if mem:
                self.cpu_only_mem[i] -= sign * mem
        self._unsigned.add(i)
        self.dirty.add(i)
        if moved:
            whole_before = self.whole_free.item(i)
            self.whole_free[i] = whole_before + moved
            old = self.buckets[(flavor, whole_before)]
            del old[bisect_left(old, i)]
            insort(self.buckets[(flavor, whole_before + moved)], i)

    def signatures(self, nodes: IntArray) -> list[int]:
        """The signature of each of ``nodes``: taken when asked for, since a node may change
        many times between two reads (trial placements, rollbacks, reservations)."""
        signature, unsigned = self._signature, self._unsigned
        out = []
        for i in nodes.tolist():
            if i in unsigned:
                unsigned.discard(i)
                signature[i] = self._sign(i)
            out.append(signature[i])
        return out

    def _sign(self, i: int) -> int:
        """An id shared by nodes in identical states (same flavor, usable free capacity per
        device, GPU memory, CPU, memory, RDMA), so per-state results can be memoised."""
        free = self.dev_free[i].tolist()
        if not self._all_usable[i]:
            free = [f if ok else -1 for f, ok in zip(free, self._usable_rows[i], strict=True)]
        key = (
            self._flavor_of[i],
            self.cpu_free.item(i),
            self.mem_free.item(i),
            self.rdma_free.item(i),
            *free,
            *self.dev_mem[i].tolist(),
        )
        return self._signatures.setdefault(key, len(self._signatures))

    def mark(self) -> int:
        return len(self._journal)

    def commit(self) -> None:
        """Keep every change so far: the journal starts again from here (mark 0)."""
        self._journal.clear()

    def rollback(self, mark: int) -> None:
        """Undo every change made since ``mark``, newest first."""
        while len(self._journal) > mark:
            i, shares, cpu, mem, rdma, sign = self._journal.pop()
            self._apply(i, shares, cpu, mem, rdma, -sign)

    def reserve(self, devices: Sequence[tuple[int, int]]) -> None:
        """Hold devices for a reservation: jobs that may not delay it must avoid them."""
        for i, d in devices:
            self.reserved[i, d] = True
        self._recount()

    def clear_reservations(self) -> None:
        if self.reserved.any():
            self.reserved[:] = False
            self._recount()

    # -- queries --------------------------------------------------------------------------

    def static_mask(
        self,
        flavor: str,
        pools: tuple[str, ...],
        tolerations: tuple[Toleration, ...],
        clusters: tuple[str, ...] = (),
        regions: tuple[str, ...] = (),
    ) -> BoolArray:
        """Nodes of ``flavor`` in ``pools``, ``clusters`` and ``regions`` (any when empty),
        schedulable, taints tolerated. Cached per cycle: none of these change inside a cycle.
        Vectorised over nodes; the taint check runs once per distinct taint set, not once
        per node."""
        key = (flavor, pools, tolerations, clusters, regions)
        mask = self._static.get(key)
        if mask is None:
            mask = self.schedulable & (self.flavor == self.flavor_code(flavor))
            if pools:
                mask &= np.isin(
                    self.pool, [self.pool_names.index(p) for p in pools if p in self.pool_names]
                )
            if clusters:
                mask &= np.isin(self.cluster, _known(self.cluster_names, clusters))
            if regions:
                mask &= np.isin(self.region, _known(self.region_names, regions))
            if self.taint_sets:
                ok = [_tolerated(taints, tolerations) for taints in self.taint_sets]
                mask &= np.array(ok, dtype=np.bool_)[self.taint_group]
            self._static[key] = mask
        return mask

    def cluster_mask(self, code: int) -> BoolArray:
        """The nodes of the cluster coded ``code`` (-1: the unlabelled nodes)."""
        mask = self._cluster_masks.get(code)
        if mask is None:
            mask = self._cluster_masks[code] = self.cluster == code
        return mask

    def cluster_codes(self, names: tuple[str, ...]) -> list[int]:
        return _known(self.cluster_names, names)

    def misfit(
        self,
        res: Resources,
        gang: int,
        flavor: str,
        pools: tuple[str, ...],
        tolerations: tuple[Toleration, ...],
        clusters: tuple[str, ...] = (),
        regions: tuple[str, ...] = (),
    ) -> Misfit | None:
        """Why no usable node of ``flavor`` could hold the gang even if it were empty (see
        ``fit``); None when some could. Cached: it depends on the nodes alone."""
        key = (res, gang, flavor, pools, tolerations, clusters, regions)
        if key not in self._misfits:
            if self._capacity is None:
                self._capacity = Capacity(
                    self.nodes, today=True, cpu_only_share=self.cpu_only_share
                )
            if len(self._misfits) >= 4096:  # a state kept across cycles sees many shapes
                self._misfits.clear()
            mask = self.static_mask(flavor, pools, tolerations, clusters, regions)
            self._misfits[key] = misfit_in_one_cluster(
                self._capacity, mask, self.cluster, res, gang, flavor
            )
        return self._misfits[key]

    def flavor_code(self, flavor: str) -> int:
        try:
            return self.flavor_names.index(flavor)
        except ValueError:
            return -1

    def free_milli(self, flavor: str) -> int:
        code = self.flavor_code(flavor)
        return self.flavor_free[code] if code >= 0 else 0
