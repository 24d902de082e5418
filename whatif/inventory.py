"""Expansion what-ifs: the inventory changed ("add N GPUs of model M", "remove", "move N from
pool A to B") and the demand scaled to a forecast, on top of a replay of the window's jobs
(whatif/replay.py applies them; capacity/expansions.py proposes them from its forecasts).

Two more kinds of change, stored in `WhatIf.changes` like the others:
- `{"kind": "inventory", "action": "add" | "remove" | "move", "flavor": M, "gpus": N,
  "from_pool"?: A, "to_pool"?: B}`: the proposed side only. Added GPUs are copies of the
  first node of model M (its size, CPU, memory, pool and labels; the last copy holds what is
  left of N); removed GPUs come off the last nodes of M, whole nodes first; a move relabels
  whole nodes of M in pool A with pool B, rounding N up to whole nodes.
- `{"kind": "demand", "flavor": M, "scale": s, "at_day": d}`: both sides (the same demand
  against today's inventory and the changed one). The jobs that may run on M (they allow M,
  or any model) are replayed s times over: each whole time as a copy arriving up to an hour
  later, the fraction as a seeded draw; below 1 each is kept with probability s. `at_day`
  records which forecast day the scale came from (capacity/expansions.py).
Pure: the engine's nodes and the simulator's jobs in, new ones out (`dataclasses.replace`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

import numpy as np

INVENTORY, DEMAND = "inventory", "demand"
ACTIONS = ("add", "remove", "move")
SEED = 39  # the same copies on both sides and on every run of the same proposal


def kind_of(change: Mapping[str, Any]) -> str:
    return str(change["kind"])


def inventory_errors(change: Mapping[str, Any], nodes: Sequence[Any]) -> dict[str, list[str]]:
    """Why `change` cannot apply to `nodes` (the engine's, present now); {} when it can."""
    flavor, gpus = change["flavor"], change["gpus"]
    of_model = [n for n in nodes if n.flavor == flavor]
    if change["action"] == "add" and not of_model:
        return {"flavor": [f"no node of {flavor} to copy: add one node of it first."]}
    if change["action"] == "remove" and gpus > sum(len(n.devices) for n in of_model):
        have = sum(len(n.devices) for n in of_model)
        return {"gpus": [f"{flavor} has {have} GPUs: fewer than {gpus} to remove."]}
    if change["action"] == "move":
        source = [n for n in of_model if n.pool == change["from_pool"]]
        have = sum(len(n.devices) for n in source)
        if change["from_pool"] == change["to_pool"]:
            return {"to_pool": ["the same pool as from_pool."]}
        if gpus > have:
            return {"gpus": [f"pool {change['from_pool']} has {have} GPUs of {flavor}."]}
    return {}


def apply_inventory(
    nodes: tuple[Any, ...], changes: Sequence[Mapping[str, Any]]
) -> tuple[Any, ...]:
    """`nodes` with every inventory change of `changes` applied, in order."""
    out = list(nodes)
    for change in changes:
        if kind_of(change) != INVENTORY:
            continue
        action = change["action"]
        if action == "add":
            out += _added(out, change["flavor"], change["gpus"])
        elif action == "remove":
            out = _removed(out, change["flavor"], change["gpus"])
        else:
            out = _moved(
                out, change["flavor"], change["gpus"], change["from_pool"], change["to_pool"]
            )
    return tuple(out)


def _added(nodes: list[Any], flavor: str, gpus: int) -> list[Any]:
    template = sorted((n for n in nodes if n.flavor == flavor), key=lambda n: n.name)[0]
    size = len(template.devices)
    added = []
    for k in range(math.ceil(gpus / size)):
        count = min(size, gpus - k * size)
        added.append(
            replace(template, name=f"{template.name}+{k + 1}", devices=template.devices[:count])
        )
    return added


def _removed(nodes: list[Any], flavor: str, gpus: int) -> list[Any]:
    left = gpus
    kept = []
    for node in sorted(nodes, key=lambda n: n.name, reverse=True):
        if node.flavor != flavor or left == 0:
            kept.append(node)
            continue
        take = min(left, len(node.devices))
        left -= take
        if take < len(node.devices):
            kept.append(replace(node, devices=node.devices[: len(node.devices) - take]))
    return sorted(kept, key=lambda n: n.name)


def _moved(nodes: list[Any], flavor: str, gpus: int, source: str, target: str) -> list[Any]:
    left = gpus
    out = []
    for node in sorted(nodes, key=lambda n: n.name, reverse=True):
        if left > 0 and node.flavor == flavor and node.pool == source:
            left -= len(node.devices)
            node = replace(node, pool=target)
        out.append(node)
    return sorted(out, key=lambda n: n.name)


def scale_demand(jobs: Sequence[Any], changes: Sequence[Mapping[str, Any]]) -> list[Any]:
    """The workload with every demand change of `changes` applied (see the module)."""
    out = list(jobs)
    for change in changes:
        if kind_of(change) == DEMAND:
            out = _scaled(out, change["flavor"], float(change["scale"]))
    return sorted(out, key=lambda w: (w.arrival_s, w.request.id))


def _scaled(jobs: list[Any], flavor: str, scale: float) -> list[Any]:
    rng = np.random.default_rng(SEED)
    whole, fraction = int(scale), scale - int(scale)
    out = []
    for job in jobs:
        allowed = job.request.flavors
        if allowed and flavor not in allowed:
            out.append(job)
            continue
        copies = whole + int(rng.random() < fraction)
        for k in range(copies):
            if k == 0:
                out.append(job)
                continue
            request = replace(job.request, id=f"{job.request.id}~{k}")
            offset = float(rng.uniform(0, 3600))
            out.append(replace(job, request=request, arrival_s=job.arrival_s + offset))
    return out
