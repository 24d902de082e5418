"""Whether a job could fit at all: on its nodes with nothing else running.

A request no node can hold (16 GPUs per replica where nodes have 8, 200000 MiB of GPU memory
where the largest device has 81920) waits forever whatever else happens; saying "no node has
16 free together" or naming one model's memory sends its owner looking in the wrong place.
``misfit`` finds the first dimension that rules every node out, with the best the nodes
offer; ``describe`` words the closest of several flavors. The submit check (on the whole
inventory) and the engine's wait reasons (on the nodes usable today) both use it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np
import numpy.typing as npt

from scheduler.core.types import MILLI_PER_GPU, Node, Resources

BoolArray = npt.NDArray[np.bool_]
IntArray = npt.NDArray[np.int64]

# The order requests are checked in: a later stage got further, so it is the closer miss.
STAGES = ("flavors", "gpus", "gpu_memory_mib", "cpu_milli", "memory_mib", "rdma", "replicas")
_NEEDS = {
    "gpus": "{need} GPUs; the most on one node is {most}",
    "gpu_memory_mib": "a GPU with {need} MiB of GPU memory; the most is {most} MiB",
    "cpu_milli": "{need} mCPU; the most is {most}",
    "memory_mib": "{need} MiB of memory; the most is {most} MiB",
    "rdma": "{need} RDMA devices; the most is {most}",
}


@dataclass(frozen=True, slots=True)
class Misfit:
    """``field``: the request field (as the job spec names it) that no node meets; ``need``
    what the job asks, ``most`` the best any node of ``flavor`` offers."""

    field: str
    flavor: str
    need: int = 0
    most: int = 0
    cpu_only: bool = False  # a request without GPUs, held to a GPU node's CPU-only share
    one_cluster: bool = False  # replicas: what one cluster holds at most (a job runs in one)

    @property
    def message(self) -> str:
        if self.field == "flavors":
            return f"no usable {self.flavor} node"
        if self.field == "replicas" and self.one_cluster:
            return (
                f"the {self.flavor} nodes of any one cluster hold at most {self.most} of the "
                f"{self.need} replicas that must run at once (a job runs in one cluster)"
            )
        if self.field == "replicas":
            return (
                f"all {self.flavor} nodes together hold {self.most} of the {self.need} "
                "replicas that must run at once"
            )
        need, most = _NEEDS[self.field].format(need=self.need, most=self.most).split("; ")
        kept = " for jobs without GPUs (the rest is kept for GPU jobs)" if self.cpu_only else ""
        return f"no {self.flavor} node has {need}{kept}; {most}"


class Capacity:
    """What each node holds when empty. ``dev_mem[node, device]`` is a device's memory, 0
    where there is no device (or, for ``today``, an unhealthy one). ``cpu_only_cpu`` and
    ``cpu_only_mem``: what jobs without GPUs may hold there (``cpu_only_room``)."""

    def __init__(self, nodes: Sequence[Node], *, today: bool, cpu_only_share: float = 1.0) -> None:
        width = max((len(node.devices) for node in nodes), default=1) or 1
        self.dev_mem = np.zeros((len(nodes), width), dtype=np.int64)
        for i, node in enumerate(nodes):
            for dev in node.devices:
                if not today or dev.healthy:
                    self.dev_mem[i, dev.index] = max(dev.memory_mib, 1)
        self.cpu = np.array([n.cpu_milli for n in nodes], dtype=np.int64)
        self.mem = np.array([n.memory_mib for n in nodes], dtype=np.int64)
        self.rdma = np.array([n.rdma for n in nodes], dtype=np.int64)
        self.cpu_only_cpu, self.cpu_only_mem = cpu_only_room(nodes, cpu_only_share)


def cpu_only_room(nodes: Sequence[Node], share: float) -> tuple[IntArray, IntArray]:
    """The CPU and memory that jobs without GPUs may hold on each node, all of them
    together: on a node with GPUs, ``share`` of its CPU and of its memory (rounded down);
    the rest is kept for jobs with GPUs, so CPU-only jobs can never leave its GPUs without
    the CPU and memory to use them. On a node without GPUs, everything."""
    cpu = np.array([n.cpu_milli for n in nodes], dtype=np.int64)
    mem = np.array([n.memory_mib for n in nodes], dtype=np.int64)
    if share >= 1:
        return cpu, mem
    has_gpus = np.array([bool(n.devices) for n in nodes], dtype=np.bool_)
    kept = np.floor(cpu * share).astype(np.int64), np.floor(mem * share).astype(np.int64)
    return np.where(has_gpus, kept[0], cpu), np.where(has_gpus, kept[1], mem)


def misfit(
    cap: Capacity, nodes: BoolArray, res: Resources, gang: int, flavor: str
) -> Misfit | None:
    """Why none of ``nodes`` (a mask over ``cap``) could hold one replica of ``res``, or all
    of them together ``gang`` replicas, even empty; None when they could."""
    if not nodes.any():
        return Misfit("flavors", flavor)
    share, k = 0 < res.gpu_milli < MILLI_PER_GPU, max(res.gpu_milli // MILLI_PER_GPU, 0)
    per_node = k or (1 if share else 0)
    # GPU memory binds shares only: whole devices are placed by count (as ``placement``).
    fitting = (cap.dev_mem >= max(res.gpu_memory_mib if share else 0, 1)).sum(axis=1)
    if per_node:
        devices = (cap.dev_mem > 0).sum(axis=1)
        if not (ok := nodes & (devices >= per_node)).any():
            return Misfit("gpus", flavor, per_node, int(devices[nodes].max()))
        nodes = ok
        if not (ok := nodes & (fitting >= per_node)).any():
            kth = np.sort(cap.dev_mem[nodes], axis=1)[:, -per_node]
            return Misfit("gpu_memory_mib", flavor, res.gpu_memory_mib, int(kth.max()))
        nodes = ok
    cpu_only = res.gpu_milli == 0
    cpu, mem = (cap.cpu_only_cpu, cap.cpu_only_mem) if cpu_only else (cap.cpu, cap.mem)
    for name, need, have, whole in (
        ("cpu_milli", res.cpu_milli, cpu, cap.cpu),
        ("memory_mib", res.memory_mib, mem, cap.mem),
        ("rdma", res.rdma, cap.rdma, cap.rdma),
    ):
        if need and not (ok := nodes & (have >= need)).any():
            # held back by the share kept for GPU jobs, not by the nodes' size: say so
            kept = bool((nodes & (whole >= need)).any())
            return Misfit(name, flavor, need, int(have[nodes].max()), kept)
        nodes = ok if need else nodes
    held = int(_replicas_per_node(cap, res, k, share, fitting)[nodes].sum())
    return Misfit("replicas", flavor, gang, held) if held < gang else None


def misfit_in_one_cluster(
    cap: Capacity, nodes: BoolArray, clusters: IntArray, res: Resources, gang: int, flavor: str
) -> Misfit | None:
    """``misfit`` for a job that runs in one cluster (``clusters``: each node's cluster code):
    a gang no one cluster of ``nodes`` could hold misfits by the most replicas one holds."""
    found = misfit(cap, nodes, res, gang, flavor)
    codes = np.unique(clusters[nodes])
    if found is not None or gang == 1 or len(codes) < 2:
        return found
    each = []
    for code in codes.tolist():
        alone = misfit(cap, nodes & (clusters == code), res, gang, flavor)
        if alone is None:
            return None
        each.append(alone)
    if any(m.field != "replicas" for m in each):
        return closest(each)
    return replace(max(each, key=lambda m: m.most), one_cluster=True)


def _replicas_per_node(
    cap: Capacity, res: Resources, k: int, share: bool, fitting: IntArray
) -> IntArray:
    """How many replicas each empty node holds, by its scarcest resource."""
    big = np.iinfo(np.int64).max // 2
    slots = np.full(len(cap.cpu), big, dtype=np.int64)
    if k:
        slots = np.minimum(slots, fitting // k)
    elif share:
        per_device = np.full(cap.dev_mem.shape, MILLI_PER_GPU // res.gpu_milli, dtype=np.int64)
        if res.gpu_memory_mib:
            per_device = np.minimum(per_device, cap.dev_mem // res.gpu_memory_mib)
        slots = np.minimum(slots, np.where(cap.dev_mem > 0, per_device, 0).sum(axis=1))
    cpu, mem = (cap.cpu_only_cpu, cap.cpu_only_mem) if res.gpu_milli == 0 else (cap.cpu, cap.mem)
    for need, have in ((res.cpu_milli, cpu), (res.memory_mib, mem), (res.rdma, cap.rdma)):
        if need:
            slots = np.minimum(slots, have // need)
    return slots


def closest(misfits: Sequence[Misfit]) -> Misfit:
    """The miss that got furthest (a later stage, then the most offered)."""
    return max(misfits, key=lambda m: (STAGES.index(m.field), m.most, m.flavor))


def describe(misfits: Sequence[Misfit]) -> str:
    """The closest miss, naming every flavor that misses alike; of several flavors tried,
    which ones."""
    best = closest(misfits)
    alike = sorted(
        m.flavor for m in misfits if (m.field, m.need, m.most) == (best.field, best.need, best.most)
    )
    named = ", ".join(alike[:-1]) + f" or {alike[-1]}" if len(alike) > 1 else alike[0]
    message = replace(best, flavor=named).message
    if len(alike) == len(misfits):
        return message
    tried = ", ".join(sorted(m.flavor for m in misfits))
    return f"{message} (the closest of {tried})"
