"""Cluster state and placement policies for ``bench.openb``.

Baselines as the FGD paper's simulator defines them (Weng et al., ATC'23, section 6.1):

- ``random``: a uniformly random node among those where the pod fits.
- ``bestfit``: the node with the least resources left after placement, as the weighted sum
  ``0.5 * cpu_left / max_node_cpu + 0.5 * gpu_left / max_node_gpu``.
- ``packing`` (GPU packing): first a GPU already in use (the fullest that fits), then fully
  free GPUs on a node already in use (fewest), then an idle node (smallest); CPU-only pods
  take the first node.

Every policy breaks ties by node order (the node list's order). Within a node, baselines put
a share on the fullest device that fits it and whole GPUs on the lowest-indexed free devices;
``gantry`` uses ``FragmentationModel.select`` for both.
"""

from __future__ import annotations

from typing import Any, Protocol

import numpy as np
import numpy.typing as npt

from bench.openb.trace import Nodes
from scheduler.core.fragmentation import MILLI, FragmentationModel, PodRequest

IntArray = npt.NDArray[np.int64]
POLICIES = ("gantry", "bestfit", "packing", "random")


class ClusterState:
    """Free resources per node and device; ``gpu_free`` is ``[N, D]`` milli-GPU, 0-padded."""

    def __init__(self, nodes: Nodes) -> None:
        counts = np.array(nodes.gpu_count, dtype=np.int64)
        exists = np.arange(max(int(counts.max()), 1)) < counts[:, None]
        self.gpu_count = counts
        self.gpu_free = np.where(exists, MILLI, 0).astype(np.int64)
        self.cpu_free = np.array(nodes.cpu_milli, dtype=np.int64)
        self.memory_free = np.array(nodes.memory_mib, dtype=np.int64)
        self.models = sorted({m for m in nodes.models if m})
        ids = {m: i for i, m in enumerate(self.models)}
        self.model_ids = np.array([ids.get(m, len(ids)) for m in nodes.models], dtype=np.int64)
        self._allowed: dict[frozenset[str], npt.NDArray[np.bool_]] = {}
        self.cpu_max = int(self.cpu_free.max())
        self.gpu_max = int(counts.max()) * MILLI

    def feasible(self, r: PodRequest) -> IntArray:
        ok = (self.cpu_free >= r.cpu_milli) & (self.memory_free >= r.memory_mib)
        if r.gpu_count:
            ok &= self._models_ok(r.gpu_models)[self.model_ids]
            ok &= (self.gpu_free >= r.gpu_milli).sum(axis=1) >= r.gpu_count
        return np.nonzero(ok)[0].astype(np.int64)

    def take(self, i: int, r: PodRequest, devices: tuple[int, ...]) -> None:
        assert len(devices) == r.gpu_count
        for d in devices:
            self.gpu_free[i, d] -= r.gpu_milli
            assert self.gpu_free[i, d] >= 0
        self.cpu_free[i] -= r.cpu_milli
        self.memory_free[i] -= r.memory_mib
        assert self.cpu_free[i] >= 0 and self.memory_free[i] >= 0

    def devices_for(self, i: int, r: PodRequest) -> tuple[int, ...]:
        """Baselines' device choice: the fullest device for a share, else the first free ones."""
        free = self.gpu_free[i]
        if r.is_share:
            fitting = np.where(free >= r.gpu_milli, free, MILLI + 1)
            return (int(np.argmin(fitting)),)
        return tuple(int(d) for d in np.nonzero(free >= r.gpu_milli)[0][: r.gpu_count])

    def _models_ok(self, models: frozenset[str]) -> npt.NDArray[np.bool_]:
        if models not in self._allowed:
            ok = np.array([not models or m in models for m in self.models] + [False])
            self._allowed[models] = ok
        return self._allowed[models]


class Policy(Protocol):
    def observe(self, r: PodRequest) -> None: ...
    def choose(self, state: ClusterState, r: PodRequest, cand: IntArray) -> int: ...
    def devices(self, state: ClusterState, i: int, r: PodRequest) -> tuple[int, ...]: ...
    def commit(self, i: int, r: PodRequest, devices: tuple[int, ...]) -> None: ...


class _Baseline:
    def observe(self, r: PodRequest) -> None:
        pass

    def devices(self, state: ClusterState, i: int, r: PodRequest) -> tuple[int, ...]:
        return state.devices_for(i, r)

    def commit(self, i: int, r: PodRequest, devices: tuple[int, ...]) -> None:
        pass


class RandomFit(_Baseline):
    def __init__(self, seed: int) -> None:
        self._rng = np.random.default_rng(seed + 7919)

    def choose(self, state: ClusterState, r: PodRequest, cand: IntArray) -> int:
        return int(cand[self._rng.integers(len(cand))])


class BestFit(_Baseline):
    def choose(self, state: ClusterState, r: PodRequest, cand: IntArray) -> int:
        cpu_left = state.cpu_free[cand] - r.cpu_milli
        gpu_left = state.gpu_free[cand].sum(axis=1) - r.total_gpu_milli
        left = 0.5 * cpu_left / state.cpu_max + 0.5 * gpu_left / state.gpu_max
        return int(cand[np.argmin(left)])


class GpuPacking(_Baseline):
    def choose(self, state: ClusterState, r: PodRequest, cand: IntArray) -> int:
        if r.gpu_count == 0:
            return int(cand[0])
        free = state.gpu_free[cand]
        count = state.gpu_count[cand]
        idle = (free == MILLI).sum(axis=1) == count
        if r.is_share:
            fullest = np.where(free >= r.gpu_milli, free, MILLI + 1).min(axis=1)
            # Scores out of 100, higher first: a used GPU 50..100 (fuller is better), a free
            # GPU on a used node 49, an idle node 33 minus its GPU count.
            used = np.where(fullest < MILLI, 100 - fullest // 100, 49)
        else:
            used = np.full(len(cand), max(50 - r.gpu_count, 33))
        score = np.where(idle, np.maximum(33 - count, count), used)
        return int(cand[np.argmax(score)])


class Gantry:
    """The fragmentation model, fed online: it sees each pod when it arrives."""

    def __init__(self, nodes: Nodes, **options: Any) -> None:
        self.model = FragmentationModel(
            nodes.models, nodes.gpu_count, nodes.cpu_milli, nodes.memory_mib, **options
        )
        self._devices: tuple[int, ...] = ()

    def observe(self, r: PodRequest) -> None:
        self.model.observe(r)

    def choose(self, state: ClusterState, r: PodRequest, cand: IntArray) -> int:
        placement = self.model.select(cand, r)
        assert placement is not None, "the model and the cluster state disagree on fit"
        self._devices = placement.devices
        return placement.node

    def devices(self, state: ClusterState, i: int, r: PodRequest) -> tuple[int, ...]:
        return self._devices

    def commit(self, i: int, r: PodRequest, devices: tuple[int, ...]) -> None:
        self.model.assign(i, r, devices)


def make_policy(name: str, nodes: Nodes, seed: int, gantry_options: dict[str, Any]) -> Policy:
    if name == "gantry":
        return Gantry(nodes, **gantry_options)
    if name == "random":
        return RandomFit(seed)
    if name == "bestfit":
        return BestFit()
    if name == "packing":
        return GpuPacking()
    raise ValueError(f"unknown policy {name!r}; choose from {', '.join(POLICIES)}")
