"""openb trace loading and the published workload protocol (helpers of ``bench.openb``).

Protocol (``../shared/bench/openb/README.md``): keep every pod of the pod list, add pods sampled
from it with replacement until the requested GPU reaches 130% of the cluster's GPU capacity,
shuffle, place one at a time on the GPU-node list with no departures.
"""

from __future__ import annotations

import csv
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from scheduler.core.fragmentation import MILLI, PodRequest

TRACES = ("default", "cpu050", "gpushare40", "gpuspec10", "multigpu20")
TARGET_ARRIVED = 1.3


@dataclass(frozen=True)
class Nodes:
    """The GPU-node list, in file order (the fixed order ties go to)."""

    names: list[str]
    models: list[str]
    gpu_count: list[int]
    cpu_milli: list[int]
    memory_mib: list[int]

    @property
    def capacity_milli(self) -> int:
        return sum(self.gpu_count) * MILLI


def load_nodes(trace_dir: Path) -> Nodes:
    with open(trace_dir / "openb_node_list_gpu_node.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    return Nodes(
        names=[r["sn"] for r in rows],
        models=[r["model"] if int(r["gpu"]) > 0 else "" for r in rows],
        gpu_count=[int(r["gpu"]) for r in rows],
        cpu_milli=[int(r["cpu_milli"]) for r in rows],
        memory_mib=[int(r["memory_mib"]) for r in rows],
    )


def load_pods(trace_dir: Path, trace: str) -> list[PodRequest]:
    """The pod list as requests. ``gpu_milli`` is per device: a share when ``num_gpu`` is 1."""
    with open(trace_dir / f"openb_pod_list_{trace}.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    pods = []
    for r in rows:
        count = int(r["num_gpu"])
        spec = (r.get("gpu_spec") or "").strip()
        pods.append(
            PodRequest(
                cpu_milli=int(r["cpu_milli"]),
                memory_mib=int(r["memory_mib"]),
                gpu_count=count,
                gpu_milli=int(r["gpu_milli"]) if count else 0,
                gpu_models=frozenset(m for m in spec.split("|") if m),
            )
        )
    return pods


def workload(pods: list[PodRequest], capacity_milli: int, seed: int) -> list[PodRequest]:
    """Every pod plus sampled ones up to 130% of capacity in requested GPU, shuffled (seeded)."""
    rng = np.random.default_rng(seed)
    out = list(pods)
    requested = sum(p.total_gpu_milli for p in pods)
    while requested < TARGET_ARRIVED * capacity_milli:
        extra = pods[int(rng.integers(len(pods)))]
        out.append(extra)
        requested += extra.total_gpu_milli
    order = rng.permutation(len(out))
    return [out[i] for i in order]


def load_pod_lifetimes(trace_dir: Path, trace: str) -> tuple[list[int], list[int], list[float]]:
    """Each pod's creation and deletion times (seconds from the trace start) and its GPUs
    (whole devices times the share of each: a 0.46 share of one GPU is 0.46), in file order."""
    with open(trace_dir / f"openb_pod_list_{trace}.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    created = [int(r["creation_time"]) for r in rows]
    deleted = [int(r["deletion_time"]) for r in rows]
    gpus = [int(r["num_gpu"]) * int(r["gpu_milli"] or 0) / MILLI for r in rows]
    return created, deleted, gpus
