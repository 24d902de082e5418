"""Request types, the workload mix, and per-type fragmentation of node states (see fragmentation).

Pure: numpy only. Units: milli-GPU (1000 = one device), CPU millicores, memory MiB.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

MILLI = 1000
IntArray = npt.NDArray[np.int64]
FloatArray = npt.NDArray[np.float64]
BoolArray = npt.NDArray[np.bool_]
# Per-device values ``[N, D]``: an array, or one sequence per node (lengths may differ).
PerDevice = Sequence[Sequence[int]] | npt.NDArray[np.int64]
# Free GPU memory when the caller does not track it: large enough for any request.
UNTRACKED_GPU_MEMORY = 1 << 40


@dataclass(frozen=True, slots=True)
class PodRequest:
    """One replica's request; also the key of a request type in the mix.

    ``gpu_count`` whole GPUs (``gpu_milli`` 1000, 0 is read as 1000), or ``gpu_count=1`` and
    ``gpu_milli`` 1..999 for a share of one device, or ``gpu_count=0`` (CPU only).
    ``gpu_memory_mib``: GPU memory needed on each device used. ``gpu_models``: any of these
    models (empty: any model).
    """

    cpu_milli: int
    memory_mib: int
    gpu_count: int = 0
    gpu_milli: int = 0
    gpu_memory_mib: int = 0
    gpu_models: frozenset[str] = frozenset()

    def __post_init__(self) -> None:
        if min(self.cpu_milli, self.memory_mib, self.gpu_count, self.gpu_memory_mib) < 0:
            raise ValueError(f"negative amount in {self}")
        if self.gpu_count == 0 and (self.gpu_milli or self.gpu_memory_mib):
            raise ValueError(f"GPU share without a GPU count in {self}")
        if self.gpu_count > 0 and self.gpu_milli == 0:
            object.__setattr__(self, "gpu_milli", MILLI)
        if not 0 <= self.gpu_milli <= MILLI:
            raise ValueError(f"gpu_milli must be 0..{MILLI} in {self}")
        if self.gpu_count > 1 and self.gpu_milli != MILLI:
            raise ValueError(f"a share of a GPU is for one device only, in {self}")

    @property
    def is_share(self) -> bool:
        return self.gpu_count == 1 and self.gpu_milli < MILLI

    @property
    def total_gpu_milli(self) -> int:
        return self.gpu_count * self.gpu_milli


class Mix:
    """The request types seen so far with their weights, stored as arrays for batch scoring.

    Types are numbered in the order first seen; ``thresholds`` are the distinct per-device
    (milli-GPU, GPU memory) pairs the types ask for, which is what fragmentation depends on.
    """

    def __init__(self, models: list[str]) -> None:
        self._model_ids = {m: i for i, m in enumerate(models)}
        self.n_models = len(models)
        self.requests: list[PodRequest] = []
        self._index: dict[PodRequest, int] = {}
        self._threshold_index: dict[tuple[int, int], int] = {}
        cap = 16
        self.count = np.zeros(cap, np.int64)
        self.milli = np.zeros(cap, np.int64)
        self.cpu = np.zeros(cap, np.int64)
        self.mem = np.zeros(cap, np.int64)
        self.threshold = np.zeros(cap, np.int64)
        self.weight = np.zeros(cap, np.float64)
        # model_ok[model id, type]; the last row is "no GPU / unknown model": never ok.
        self.model_ok = np.zeros((self.n_models + 1, cap), np.bool_)
        self.threshold_milli = np.zeros(0, np.int64)
        self.threshold_gmem = np.zeros(0, np.int64)

    def __len__(self) -> int:
        return len(self.requests)

    def model_id(self, model: str) -> int:
        return self._model_ids.get(model, self.n_models)

    def add(self, request: PodRequest, weight: float = 1.0) -> int:
        """Add ``weight`` to the request's type (creating it); return the type index."""
        t = self._index.get(request)
        if t is None:
            t = self._new_type(request)
        self.weight[t] += weight
        return t

    def weights(self, types: IntArray) -> npt.NDArray[np.float64]:
        return self.weight[types]

    def _new_type(self, r: PodRequest) -> int:
        t = len(self.requests)
        if t == len(self.count):
            self._grow()
        self.requests.append(r)
        self._index[r] = t
        self.count[t], self.milli[t] = r.gpu_count, r.gpu_milli
        self.cpu[t], self.mem[t] = r.cpu_milli, r.memory_mib
        key = (r.gpu_milli, r.gpu_memory_mib)
        if key not in self._threshold_index:
            self._threshold_index[key] = len(self._threshold_index)
            self.threshold_milli = np.append(self.threshold_milli, r.gpu_milli)
            self.threshold_gmem = np.append(self.threshold_gmem, r.gpu_memory_mib)
        self.threshold[t] = self._threshold_index[key]
        allowed = r.gpu_models or set(self._model_ids)
        for m in allowed:
            if m in self._model_ids:
                self.model_ok[self._model_ids[m], t] = r.gpu_count > 0
        return t

    def _grow(self) -> None:
        for name in ("count", "milli", "cpu", "mem", "threshold", "weight"):
            old = getattr(self, name)
            setattr(self, name, np.concatenate([old, np.zeros_like(old)]))
        self.model_ok = np.concatenate([self.model_ok, np.zeros_like(self.model_ok)], axis=1)


def type_fragmentation(
    mix: Mix,
    types: IntArray,
    gpu_free: IntArray,
    gpu_memory_free: IntArray,
    cpu_free: IntArray,
    memory_free: IntArray,
    model_ids: IntArray,
) -> IntArray:
    """``F[s, j]``: milli-GPU of node state s that request type ``types[j]`` cannot use.

    Shapes: ``gpu_free`` and ``gpu_memory_free`` ``[S, D]``; the rest ``[S]``. For each
    distinct per-device threshold, ``usable`` counts and sums the devices that could take one
    replica; a type fits when enough devices are usable and CPU, memory and model allow it.
    """
    if len(types) == 0:
        return np.zeros((len(gpu_free), 0), np.int64)
    used, local = np.unique(mix.threshold[types], return_inverse=True)
    ge = gpu_free[:, :, None] >= mix.threshold_milli[used]
    gmem_need = mix.threshold_gmem[used]
    if gmem_need.any():
        ge &= gpu_memory_free[:, :, None] >= gmem_need
    usable_count = ge.sum(axis=1)
    usable_milli = np.einsum("sd,sdg->sg", gpu_free, ge.astype(np.int64))
    total = gpu_free.sum(axis=1)
    fits = (
        (usable_count[:, local] >= mix.count[types])
        & (cpu_free[:, None] >= mix.cpu[types])
        & (memory_free[:, None] >= mix.mem[types])
        & mix.model_ok[np.ix_(model_ids, types)]
    )
    return np.asarray(total[:, None] - np.where(fits, usable_milli[:, local], 0), dtype=np.int64)


def expected_fragmentation(
    models: Sequence[str],
    gpu_free: npt.ArrayLike,
    cpu_free: npt.ArrayLike,
    memory_free: npt.ArrayLike,
    mix: Sequence[tuple[PodRequest, float]],
    gpu_memory_free: npt.ArrayLike | None = None,
) -> FloatArray:
    """Expected fragmentation ``[N]`` (milli-GPU) of each node for a mix of (request, weight).

    Weights are normalised to sum to 1; an empty mix gives zeros.
    """
    table = Mix(sorted({m for m in models if m}))
    for request, weight in mix:
        table.add(request, weight)
    free = np.asarray(gpu_free, dtype=np.int64)
    gmem = (
        np.full_like(free, UNTRACKED_GPU_MEMORY)
        if gpu_memory_free is None
        else np.asarray(gpu_memory_free, dtype=np.int64)
    )
    model_ids = np.array([table.model_id(m) for m in models], dtype=np.int64)
    types = np.arange(len(table), dtype=np.int64)
    per_type = type_fragmentation(
        table,
        types,
        free,
        gmem,
        np.asarray(cpu_free, dtype=np.int64),
        np.asarray(memory_free, dtype=np.int64),
        model_ids,
    )
    weights = table.weights(types)
    total = weights.sum()
    if total <= 0:
        return np.zeros(len(models))
    return np.asarray(per_type @ (weights / total), dtype=np.float64)


def share_options(free: IntArray, gmem: IntArray, request: PodRequest) -> tuple[IntArray, IntArray]:
    """(row, device) pairs where a share fits, one per distinct device state on each row.

    Devices with equal free milli-GPU and GPU memory leave the node in equivalent states, so
    only the lowest-indexed one is scored; that is also the tie-break ``select`` applies.
    """
    usable = (free >= request.gpu_milli) & (gmem >= request.gpu_memory_mib)
    d = free.shape[1]
    earlier = np.tri(d, d, -1, dtype=np.bool_)  # earlier[j, k]: device k comes before j
    same = (free[:, :, None] == free[:, None, :]) & (gmem[:, :, None] == gmem[:, None, :])
    duplicate = (same & usable[:, None, :] & earlier).any(axis=2)
    rows, device = np.nonzero(usable & ~duplicate)
    return rows.astype(np.int64), device.astype(np.int64)


def per_device(values: PerDevice | None, exists: BoolArray, default: int) -> IntArray:
    if values is None:
        return np.where(exists, default, 0).astype(np.int64)
    out = np.zeros(exists.shape, np.int64)
    for i, row in enumerate(values):  # rows may differ in length
        given = np.asarray(row, dtype=np.int64)
        out[i, : len(given)] = given
    return np.where(exists, out, 0)
