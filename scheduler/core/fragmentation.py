"""Fragmentation-aware scoring: FGD (Weng et al., USENIX ATC'23, "Beware of Fragmentation").

Pure: numpy only, no I/O, no clock, no randomness; the same calls give the same answers.

Idea. A node's *expected fragmentation* is the GPU capacity that the typical request cannot use
there, averaged over the workload mix::

    frag(node) = sum over request types t of  p_t * F(node, t)        (milli-GPU)

    F(node, t) = free milli-GPU on the node's devices that each have less than t's per-device
                 share free (and, when t asks for GPU memory, less than its GPU memory), when t
                 fits on the node as a whole (GPU model, device count, CPU, memory);
               = all free milli-GPU on the node otherwise (t cannot start there at all; CPU-only
                 types can use no GPU, so every free GPU counts for them).

A placement is scored by how much it raises the expected fragmentation of the node it lands
on (``score``); ``select`` takes the smallest increase after rounding it to a coarse step, ties
to the earliest candidate in the caller's (fixed) node order, which is what makes FGD pack.
The mix ``p`` is learned online from the requests passed to ``observe`` (never the future).

Units: GPU amounts in milli-GPU (1000 = one whole device), CPU in millicores, memory and GPU
memory in MiB. Devices of a node are indexed 0..D-1; arrays of per-device values have shape
``[N, D]`` where D is the largest device count, and a node with fewer devices pads with zeros.

Public API
----------
``PodRequest(cpu_milli, memory_mib, gpu_count=0, gpu_milli=0, gpu_memory_mib=0, gpu_models=...)``
    One replica's request, and the key of a request type in the mix. ``gpu_count`` whole GPUs
    (``gpu_milli`` is then 1000; 0 is read as 1000), or ``gpu_count=1`` with ``gpu_milli`` in
    1..999 for a share of one device (optionally ``gpu_memory_mib`` on that device), or
    ``gpu_count=0`` for a CPU-only request. ``gpu_models``: allowed models, empty = any.

``FragmentationModel(models, gpu_count, cpu_free, memory_free, *, gpu_free=None,
gpu_memory_free=None, **profile)``
    Node state and the per-node, per-type fragmentation cache ``[N, T]``. The defaults of the
    profile keywords are Gantry's profile, measured in ``docs/bench-openb.md``: increases
    compared in steps of 100 milli-GPU, the types making up 95% of the mix, CPU-only pods
    scored exactly and, on equal scores, sent to the nodes with the fewest free GPUs.
    ``models[i]``: GPU model of node i (``""`` for none); ``gpu_count[i]``: its devices;
    ``cpu_free``, ``memory_free``: ``[N]``; ``gpu_free``: ``[N, D]`` (default: all free);
    ``gpu_memory_free``: ``[N, D]`` (default: not tracked, every device has enough).

    - ``observe(request)``: add one arrival to the mix (call it when a request arrives).
    - ``update_node(i, *, gpu_free_milli, cpu_free_milli, memory_free_mib,
      gpu_memory_free_mib=None)``: node i changed; only its cache row is recomputed.
    - ``assign(i, request, devices)``: take ``request`` on node i's ``devices`` and update.
    - ``feasible(request) -> bool[N]``: nodes where the request fits now.
    - ``score(candidates, request) -> float64[len(candidates)]``: the exact increase in
      expected fragmentation (milli-GPU) of the best device choice on each candidate, ``inf``
      where it does not fit. One numpy batch for all candidates.
    - ``select(candidates, request) -> Placement | None``: the node and devices to use: the
      smallest coarse increase, ties to the earliest candidate (pass them in a fixed order).
    - ``choose_devices(i, request) -> tuple[int, ...]``: the devices ``select`` would use on
      node i: for a share, the device whose use adds the least fragmentation; for whole GPUs,
      the lowest-indexed fully free devices; ``()`` for CPU-only.
    - ``node_fragmentation() -> float64[N]``: expected fragmentation of every node.
    - ``copy()``: an independent model, for placing a gang tentatively.

``expected_fragmentation(...)``: the same measure for arbitrary node arrays and a given mix,
without a cache (used by tests and benchmarks to check the model).
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from scheduler.core.fragmentation_mix import (
    MILLI,
    UNTRACKED_GPU_MEMORY,
    BoolArray,
    FloatArray,
    IntArray,
    Mix,
    PerDevice,
    PodRequest,
    expected_fragmentation,
    per_device,
    share_options,
    type_fragmentation,
)

__all__ = [
    "MILLI",
    "FragmentationModel",
    "Placement",
    "PodRequest",
    "expected_fragmentation",
]


@dataclass(frozen=True, slots=True)
class Placement:
    """Where ``select`` puts a request: node index, device indices, exact fragmentation added."""

    node: int
    devices: tuple[int, ...]
    delta_milli: float


QUANTIZERS = ("step", "sigmoid", "exact")
TIE_BREAKS = ("order", "bestfit")


class FragmentationModel:
    """Node state, the online mix, and a cache of each node's fragmentation per request type.

    ``step_milli`` and ``quantizer`` set how coarsely ``select`` compares increases:
    ``"step"`` floors them to multiples of ``step_milli``; ``"sigmoid"`` is FGD's published
    score ``floor(100 * sigmoid(-delta / 1000))``; ``"exact"`` compares them as they are.
    ``coverage`` < 1 keeps only the most popular types that make up that share of the mix
    (FGD's "typical pods"). ``half_life`` (in requests) makes older arrivals count less.
    ``tie_break="bestfit"`` breaks equal keys by least CPU + GPU left instead of node order.
    For CPU-only requests, ``cpu_only_step`` replaces ``step_milli`` (0: exact, ``None``: the
    same step) and ``cpu_only_to_busy`` breaks ties by fewest free GPUs left on the node:
    a CPU-only pod strands no GPU where the GPUs are already taken.
    """

    def __init__(
        self,
        models: Sequence[str],
        gpu_count: Sequence[int],
        cpu_free: npt.ArrayLike,
        memory_free: npt.ArrayLike,
        *,
        gpu_free: PerDevice | None = None,
        gpu_memory_free: PerDevice | None = None,
        step_milli: float = 100.0,
        quantizer: str = "step",
        tie_break: str = "order",
        coverage: float = 0.95,
        half_life: float | None = None,
        cpu_only_step: float | None = 0.0,
        cpu_only_to_busy: bool = True,
    ) -> None:
        if quantizer not in QUANTIZERS or tie_break not in TIE_BREAKS:
            raise ValueError(f"unknown quantizer {quantizer!r} or tie_break {tie_break!r}")
        if quantizer == "step" and step_milli <= 0:
            raise ValueError("step_milli must be positive")
        if not 0 < coverage <= 1:
            raise ValueError("coverage must be in (0, 1]")
        counts = np.asarray(gpu_count, dtype=np.int64)
        exists = np.arange(max(int(counts.max(initial=0)), 1)) < counts[:, None]
        self._mix = Mix(sorted({m for m in models if m}))
        self.model_ids = np.array([self._mix.model_id(m) for m in models], dtype=np.int64)
        self.gpu_free = per_device(gpu_free, exists, MILLI)
        self.gpu_memory_free = per_device(gpu_memory_free, exists, UNTRACKED_GPU_MEMORY)
        self.cpu_free = np.array(cpu_free, dtype=np.int64)
        self.memory_free = np.array(memory_free, dtype=np.int64)
        self._cpu_scale = max(int(self.cpu_free.max(initial=1)), 1)
        self._gpu_scale = max(int(counts.max(initial=1)), 1) * MILLI
        self._cache = np.zeros((len(counts), 16), np.int64)
        self._step, self._quantizer, self._tie_break = step_milli, quantizer, tie_break
        self._coverage = coverage
        self._cpu_only_step = cpu_only_step
        self._cpu_only_to_busy = cpu_only_to_busy
        self._decay = 2.0 ** (-1.0 / half_life) if half_life else 1.0
        self._active: tuple[IntArray, FloatArray] | None = None

    # -- the mix ------------------------------------------------------------------------------

    def observe(self, request: PodRequest, count: int = 1) -> None:
        """Count ``count`` arrivals of ``request`` in the mix (before or after placing them).
        Several at once are the same as one by one only without decay (``half_life``)."""
        if count != 1 and self._decay != 1.0:
            for _ in range(count):
                self.observe(request)
            return
        if self._decay != 1.0:
            self._mix.weight[: len(self._mix)] *= self._decay
        n_before = len(self._mix)
        self._mix.add(request, float(count))
        if len(self._mix) > n_before:
            self._add_cache_column(n_before)
        self._active = None

    def mix(self) -> list[tuple[PodRequest, float]]:
        """The types in use for scoring with their probabilities (sum 1)."""
        types, probs = self._active_types()
        return [(self._mix.requests[t], float(p)) for t, p in zip(types, probs, strict=True)]

    def _active_types(self) -> tuple[IntArray, FloatArray]:
        if self._active is None:
            weights = self._mix.weight[: len(self._mix)]
            order = np.argsort(-weights, kind="stable")
            cumulative = np.cumsum(weights[order])
            total = cumulative[-1] if len(cumulative) else 0.0
            keep = int(np.searchsorted(cumulative, self._coverage * total * (1 - 1e-12))) + 1
            types = np.sort(order[: min(keep, len(order))]).astype(np.int64)
            kept = weights[types].sum()
            probs = weights[types] / kept if kept > 0 else weights[types]
            self._active = (types, probs)
        return self._active

    # -- node state and cache -----------------------------------------------------------------

    def update_node(
        self,
        i: int,
        *,
        gpu_free_milli: Sequence[int] | npt.ArrayLike,
        cpu_free_milli: int,
        memory_free_mib: int,
        gpu_memory_free_mib: Sequence[int] | npt.ArrayLike | None = None,
    ) -> None:
        """Node ``i`` changed (placement, release, resize): store it and refresh its cache row."""
        free = np.asarray(gpu_free_milli, dtype=np.int64)
        self.gpu_free[i, :] = 0
        self.gpu_free[i, : len(free)] = free
        if gpu_memory_free_mib is not None:
            gmem = np.asarray(gpu_memory_free_mib, dtype=np.int64)
            self.gpu_memory_free[i, :] = 0
            self.gpu_memory_free[i, : len(gmem)] = gmem
        self.cpu_free[i], self.memory_free[i] = cpu_free_milli, memory_free_mib
        self._refresh(i)

    def assign(self, i: int, request: PodRequest, devices: Sequence[int]) -> None:
        """Take ``request`` on node ``i`` using ``devices`` (from ``select``/``choose_devices``)."""
        if len(set(devices)) != request.gpu_count:
            raise ValueError(f"{request} needs {request.gpu_count} devices, got {devices}")
        dev = np.asarray(devices, dtype=np.int64)
        free, gmem = self.gpu_free[i].copy(), self.gpu_memory_free[i].copy()
        free[dev] -= request.gpu_milli
        gmem[dev] -= request.gpu_memory_mib
        cpu = int(self.cpu_free[i]) - request.cpu_milli
        mem = int(self.memory_free[i]) - request.memory_mib
        if (free < 0).any() or (gmem < 0).any() or cpu < 0 or mem < 0:
            raise ValueError(f"{request} does not fit on node {i} devices {devices}")
        self.update_node(
            i,
            gpu_free_milli=free,
            cpu_free_milli=cpu,
            memory_free_mib=mem,
            gpu_memory_free_mib=gmem,
        )

    def copy(self) -> FragmentationModel:
        """An independent copy: place a gang on it, keep it to commit, drop it to discard."""
        return copy.deepcopy(self)

    def node_fragmentation(self) -> FloatArray:
        """Expected fragmentation ``[N]`` in milli-GPU under the current mix."""
        types, probs = self._active_types()
        return np.asarray(self._cache[:, types] @ probs, dtype=np.float64)

    def _refresh(self, i: int) -> None:
        n = len(self._mix)
        rows = slice(i, i + 1)
        self._cache[i, :n] = self._fragmentation_of(
            np.arange(n, dtype=np.int64),
            self.gpu_free[rows],
            self.gpu_memory_free[rows],
            self.cpu_free[rows],
            self.memory_free[rows],
            self.model_ids[rows],
        )[0]

    def _add_cache_column(self, first_new: int) -> None:
        n = len(self._mix)
        while n > self._cache.shape[1]:
            self._cache = np.concatenate([self._cache, np.zeros_like(self._cache)], axis=1)
        self._cache[:, first_new:n] = self._fragmentation_of(
            np.arange(first_new, n, dtype=np.int64),
            self.gpu_free,
            self.gpu_memory_free,
            self.cpu_free,
            self.memory_free,
            self.model_ids,
        )

    def _fragmentation_of(
        self,
        types: IntArray,
        gpu_free: IntArray,
        gmem: IntArray,
        cpu: IntArray,
        mem: IntArray,
        model_ids: IntArray,
    ) -> IntArray:
        return type_fragmentation(self._mix, types, gpu_free, gmem, cpu, mem, model_ids)

    # -- scoring ------------------------------------------------------------------------------

    def feasible(self, request: PodRequest) -> BoolArray:
        """``bool[N]``: nodes where ``request`` fits now (model, devices, CPU, memory)."""
        return self._fits(np.arange(len(self.cpu_free), dtype=np.int64), request)

    def score(self, candidates: Sequence[int] | IntArray, request: PodRequest) -> FloatArray:
        """Exact increase in expected fragmentation (milli-GPU) per candidate; ``inf``: no fit.

        For a share, the increase of the device that adds the least; negative values mean the
        placement leaves the node less fragmented for the mix (it fills a hole).
        """
        cand = np.asarray(candidates, dtype=np.int64)
        options = self._options(cand, request)
        out = np.full(len(cand), np.inf)
        np.minimum.at(out, options.position, options.delta)
        return out

    def select(self, candidates: Sequence[int] | IntArray, request: PodRequest) -> Placement | None:
        """The placement that adds the least coarse fragmentation, or ``None`` if none fits.

        Ties go to the earliest candidate, then the lowest device: pass candidates in a fixed
        node order and equal scores pack onto the same nodes.
        """
        cand = np.asarray(candidates, dtype=np.int64)
        options = self._options(cand, request)
        if len(options.position) == 0:
            return None
        keys = self._keys(options.delta, request)
        if request.gpu_count == 0 and self._cpu_only_to_busy:
            best = int(np.lexsort((options.position, options.gpu_after, keys))[0])
        elif self._tie_break == "bestfit":
            fit = options.cpu_after / self._cpu_scale + options.gpu_after / self._gpu_scale
            best = int(np.lexsort((options.device, options.position, fit, keys))[0])
        else:
            best = int(np.lexsort((options.device, options.position, keys))[0])
        node = int(cand[options.position[best]])
        if request.is_share:
            devices: tuple[int, ...] = (int(options.device[best]),)
        else:
            devices = self._whole_devices(node, request)
        return Placement(node, devices, float(options.delta[best]))

    def choose_devices(self, i: int, request: PodRequest) -> tuple[int, ...]:
        """The devices ``select`` would use on node ``i``; ``ValueError`` if it does not fit."""
        placement = self.select([i], request)
        if placement is None:
            raise ValueError(f"{request} does not fit on node {i}")
        return placement.devices

    def _keys(self, delta: FloatArray, request: PodRequest) -> FloatArray:
        if self._quantizer == "exact":
            return delta
        if request.gpu_count == 0 and self._cpu_only_step is not None:
            if self._cpu_only_step <= 0:
                return delta
            return np.floor(delta / self._cpu_only_step + 1e-9)
        if self._quantizer == "sigmoid":
            # FGD's int64(sigmoid(decrease / 1000) * 100), as a cost: lower is better.
            return -np.floor(100.0 / (1.0 + np.exp(np.clip(delta, -1e5, 1e5) / MILLI)))
        # The epsilon keeps an increase of exactly k steps in bin k despite float rounding.
        return np.floor(delta / self._step + 1e-9)

    def _fits(self, nodes: IntArray, request: PodRequest) -> BoolArray:
        ok = (self.cpu_free[nodes] >= request.cpu_milli) & (
            self.memory_free[nodes] >= request.memory_mib
        )
        if request.gpu_count == 0:
            return np.asarray(ok, dtype=np.bool_)
        usable = (self.gpu_free[nodes] >= request.gpu_milli) & (
            self.gpu_memory_free[nodes] >= request.gpu_memory_mib
        )
        allowed = self._allowed_models(request)
        return np.asarray(
            ok & allowed[self.model_ids[nodes]] & (usable.sum(axis=1) >= request.gpu_count),
            dtype=np.bool_,
        )

    def _allowed_models(self, request: PodRequest) -> BoolArray:
        allowed = np.zeros(self._mix.n_models + 1, np.bool_)
        if not request.gpu_models:
            allowed[:-1] = True
        for m in request.gpu_models:
            allowed[self._mix.model_id(m)] = True
        allowed[-1] = False
        return allowed

    def _whole_devices(self, node: int, request: PodRequest) -> tuple[int, ...]:
        if request.gpu_count == 0:
            return ()
        usable = (self.gpu_free[node] >= request.gpu_milli) & (
            self.gpu_memory_free[node] >= request.gpu_memory_mib
        )
        return tuple(int(d) for d in np.nonzero(usable)[0][: request.gpu_count])

    def _options(self, cand: IntArray, request: PodRequest) -> _Options:
        """Every way to place ``request`` on the fitting candidates, with its exact delta."""
        position = np.nonzero(self._fits(cand, request))[0]
        nodes = cand[position]
        free = self.gpu_free[nodes]
        gmem = self.gpu_memory_free[nodes]
        device = np.full(len(nodes), -1, np.int64)
        if request.is_share:
            rows, device = share_options(free, gmem, request)
            position, nodes, free, gmem = position[rows], nodes[rows], free[rows], gmem[rows]
            at = np.arange(len(rows))
            free[at, device] -= request.gpu_milli
            gmem[at, device] -= request.gpu_memory_mib
        elif request.gpu_count > 0:
            usable = (free >= request.gpu_milli) & (gmem >= request.gpu_memory_mib)
            take = usable & (np.cumsum(usable, axis=1) <= request.gpu_count)
            free = free - take * request.gpu_milli
            gmem = gmem - take * request.gpu_memory_mib
        cpu = self.cpu_free[nodes] - request.cpu_milli
        mem = self.memory_free[nodes] - request.memory_mib
        types, probs = self._active_types()
        after = self._fragmentation_of(types, free, gmem, cpu, mem, self.model_ids[nodes])
        delta = (after - self._cache[np.ix_(nodes, types)]) @ probs
        return _Options(position, device, np.asarray(delta, np.float64), cpu, free.sum(axis=1))


@dataclass(frozen=True, slots=True)
class _Options:
    """Candidate placements, one row each: candidate position, device (-1: not a share)."""

    position: IntArray
    device: IntArray
    delta: FloatArray
    cpu_after: IntArray
    gpu_after: IntArray
