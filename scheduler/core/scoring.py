"""Scoring plugins: each scores feasible candidate nodes for one replica, higher is better.

A plugin's ``score(inp)`` returns one float per candidate; the profile weighs and sums them
and placement takes the best, ties to the earliest node (fixed node order packs). Scales:

- ``GpuFit`` (best fit) in [0, 1]: 1 - GPU left free on the node (or device, for a share)
  after placing, as a fraction of the node (device).
- ``FragmentationScore`` in GPUs: minus the expected fragmentation the placement adds (FGD;
  ``scheduler.core.fragmentation``; negative when it fills a hole) rounded down to the
  profile's ``fragmentation_step_milli``. One GPU of added fragmentation outweighs the whole
  range of ``GpuFit`` at equal weights, so best fit decides among placements that fragment
  about alike. FGD's published scorer uses a coarse step and node order as tie-break; with
  best fit breaking ties a finer step measured better on openb (see docs/engine.md).
- ``TopologyScore`` in [0, 1]: for a gang, 1 on a node already used by the gang, 2/3 in the
  same NVLink domain, 1/3 in the same rack; for its first replica, how much of the rest of
  the gang the node could also take.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from scheduler.core.fragmentation import FragmentationModel, PodRequest
from scheduler.core.tentative import ClusterState, IntArray
from scheduler.core.types import MILLI_PER_GPU, Resources

FloatArray = npt.NDArray[np.float64]
DEFAULT_STEP_MILLI = 100.0


@dataclass(slots=True)
class ScoreInput:
    """One replica to score: candidate nodes and, for a share, the device on each."""

    state: ClusterState
    nodes: IntArray
    devices: IntArray | None
    resources: Resources
    flavors: tuple[str, ...]
    placed: list[int] = field(default_factory=list)
    remaining: int = 1
    avoid_reserved: bool = False


class GpuFit:
    name = "GpuFit"

    def score(self, inp: ScoreInput) -> FloatArray:
        state, nodes, res = inp.state, inp.nodes, inp.resources
        if inp.devices is not None:
            left = state.dev_free[nodes, inp.devices] - res.gpu_milli
            return np.asarray(1.0 - left / MILLI_PER_GPU, dtype=np.float64)
        left = state.node_free[nodes] - res.gpu_milli
        return np.asarray(1.0 - left / (state.max_devices * MILLI_PER_GPU), dtype=np.float64)


class TopologyScore:
    name = "TopologyScore"

    def score(self, inp: ScoreInput) -> FloatArray:
        state, nodes = inp.state, inp.nodes
        if inp.placed:
            placed = np.array(inp.placed, dtype=np.int64)
            same_node = np.isin(nodes, placed)
            same_domain = _shares_label(state.domain[nodes], state.domain[placed])
            same_rack = _shares_label(state.rack[nodes], state.rack[placed])
            best = np.maximum(np.maximum(same_node * 1.0, same_domain * (2 / 3)), same_rack / 3)
            return np.asarray(best, dtype=np.float64)
        if inp.remaining <= 1 or inp.resources.whole_gpus == 0:
            return np.zeros(len(nodes))
        avail = state.whole_free[nodes]
        if inp.avoid_reserved:
            avail = avail - state.reserved_whole_free[nodes]
        want = inp.resources.whole_gpus * inp.remaining
        return np.asarray(np.minimum(avail / want, 1.0), dtype=np.float64)


def _shares_label(candidates: IntArray, placed: IntArray) -> npt.NDArray[np.bool_]:
    labelled = placed[placed >= 0]
    return (candidates >= 0) & np.isin(candidates, labelled)


class FragmentationScore:
    """FGD over the mix of requests in the snapshot (pending and running: what arrives now),
    given as ((resources, flavors), count) pairs.

    The model mirrors the state's free capacity; a node the state marks dirty is re-synced
    lazily, when it is next scored in a state whose deltas are not memoised.
    """

    name = "FragmentationScore"

    def __init__(
        self,
        state: ClusterState,
        mix: Iterable[tuple[tuple[Resources, tuple[str, ...]], int]],
        step_milli: float = DEFAULT_STEP_MILLI,
    ):
        self.state, self.step = state, step_milli
        nodes = state.nodes
        self.model = FragmentationModel(
            [n.flavor for n in nodes],
            [len(n.devices) for n in nodes],
            state.cpu_free,
            state.mem_free,
            gpu_free=np.where(state.usable, state.dev_free, 0),
            gpu_memory_free=state.dev_mem,
        )
        for (resources, flavors), count in mix:
            if resources.gpu_milli > 0:
                self.model.observe(pod_request(resources, flavors), count)
        state.dirty.clear()
        self._requests: dict[tuple[Resources, tuple[str, ...]], PodRequest] = {}
        self._memo: dict[PodRequest, dict[int, float]] = {}  # request -> signature -> score

    def observe(self, resources: Resources, flavors: tuple[str, ...]) -> None:
        """Add one arrival to the mix (for replays that learn it online, request by request);
        memoised scores were for the old mix, so they go."""
        if resources.gpu_milli > 0:
            self.model.observe(self._request(resources, flavors))
            self._memo.clear()

    def score(self, inp: ScoreInput) -> FloatArray:
        return self._scores(inp.nodes, self._request(inp.resources, inp.flavors))

    def _request(self, resources: Resources, flavors: tuple[str, ...]) -> PodRequest:
        key = (resources, flavors)
        request = self._requests.get(key)
        if request is None:
            request = self._requests[key] = pod_request(resources, flavors)
        return request

    def _scores(self, nodes: IntArray, request: PodRequest) -> FloatArray:
        """The score per candidate: the model's delta in steps of ``step`` milli-GPU,
        negated, in GPUs. Memoised per (node state, request): within a cycle the mix is
        fixed, so the score is a function of those two alone. Candidates mostly share a few
        states (empty nodes, nodes filled alike), so most are hits, and a hit is looked up
        whole (no arithmetic on the candidates' array)."""
        signatures = self.state.signatures(nodes)
        table = self._memo.setdefault(request, {})  # hash the request once, not per node
        missing = {sig: i for i, sig in enumerate(signatures) if sig not in table}
        if missing:
            chosen = nodes[list(missing.values())]
            self._sync(chosen.tolist())
            delta = self.model.score(chosen, request)
            coarse = np.floor(delta / self.step + 1e-9) * self.step
            scored = np.asarray(-np.minimum(coarse, 1e9) / MILLI_PER_GPU, dtype=np.float64)
            table.update(zip(missing, scored.tolist(), strict=True))
        return np.array([table[sig] for sig in signatures], dtype=np.float64)

    def _sync(self, nodes: list[int]) -> None:
        """Bring the model's rows of ``nodes`` up to the state. The model is read only for
        the nodes it scores, so a node changed since stays dirty until it is scored: most
        never are, their new state's deltas being memoised already."""
        state, dirty = self.state, self.state.dirty
        for i in nodes:
            if i not in dirty:
                continue
            dirty.discard(i)
            self.model.update_node(
                i,
                gpu_free_milli=np.where(state.usable[i], state.dev_free[i], 0),
                cpu_free_milli=int(state.cpu_free[i]),
                memory_free_mib=int(state.mem_free[i]),
                gpu_memory_free_mib=state.dev_mem[i],
            )


def pod_request(resources: Resources, flavors: tuple[str, ...]) -> PodRequest:
    """The fragmentation model's view of one replica."""
    count = resources.whole_gpus or (1 if resources.is_shared else 0)
    return PodRequest(
        cpu_milli=resources.cpu_milli,
        memory_mib=resources.memory_mib,
        gpu_count=count,
        gpu_milli=resources.gpu_milli if resources.is_shared else (MILLI_PER_GPU if count else 0),
        gpu_memory_mib=resources.gpu_memory_mib if resources.is_shared else 0,
        gpu_models=frozenset(flavors),
    )


Scorer = GpuFit | TopologyScore | FragmentationScore
