"""The simulated cluster's nodes: made to order, read from the OpenB trace's node list, or
the demo's inventory."""

from __future__ import annotations

import csv
from pathlib import Path
from typing import Any

from scheduler.backends.base import GpuInfo, NodeInfo


def make_nodes(
    count: int,
    flavor: str,
    gpus: int = 8,
    memory_mib: int = 81920,
    prefix: str = "node",
    cpu_milli: int = 128_000,
    memory: int = 1_048_576,
    labels: dict[str, str] | None = None,
) -> list[NodeInfo]:
    return [
        NodeInfo(
            f"{prefix}-{i:04d}",
            flavor,
            tuple(GpuInfo(g, memory_mib, uuid=f"GPU-{prefix}-{i}-{g}") for g in range(gpus)),
            cpu_milli,
            memory,
            labels=dict(labels or {}),
        )
        for i in range(count)
    ]


# openb GPU model names -> Gantry flavor names and device memory (MiB).
OPENB_MODELS = {
    "P100": ("P100-16GB", 16384),
    "T4": ("T4-16GB", 16384),
    "V100M16": ("V100-16GB", 16384),
    "V100M32": ("V100-32GB", 32768),
    "A10": ("A10-24GB", 24576),
    "G2": ("G2", 16384),
    "G3": ("G3", 32768),
}


def nodes_from_openb_csv(path: Path) -> list[NodeInfo]:
    """Nodes of an openb node list (sn, cpu_milli, memory_mib, gpu, model)."""
    out = []
    with path.open() as handle:
        for row in csv.DictReader(handle):
            flavor, memory = OPENB_MODELS.get(row["model"], (row["model"], 16384))
            gpus = int(row["gpu"])
            devices = tuple(GpuInfo(g, memory, uuid=f"GPU-{row['sn']}-{g}") for g in range(gpus))
            out.append(
                NodeInfo(
                    row["sn"],
                    flavor if gpus else "",
                    devices,
                    int(row["cpu_milli"]),
                    int(row["memory_mib"]),
                )
            )
    return out


# The simulated cluster of the demo: node name prefix, flavor, nodes, GPUs each, GPU memory MiB.
# 32 H100, 32 A100, 16 L40S, 16 T4: the organisation's quota, so borrowing and preemption show.
DEMO_INVENTORY = [
    ("h100", "H100-80GB", 4, 8, 81920),
    ("a100", "A100-40GB", 4, 8, 40960),
    ("l40s", "L40S-48GB", 2, 8, 49152),
    ("t4", "T4-16GB", 2, 8, 16384),
]


def demo_nodes() -> list[Any]:
    """NodeInfo for the simulated cluster of the demo (see DEMO_INVENTORY)."""
    nodes = []
    for prefix, flavor, count, gpus, memory in DEMO_INVENTORY:
        rack = {"gantry.io/rack": f"rack-{prefix}"}
        nodes += make_nodes(count, flavor, gpus, memory, prefix=f"sim-{prefix}", labels=rack)
    return nodes
