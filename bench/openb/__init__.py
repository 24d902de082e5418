"""openb benchmark: GPU allocation ratio of Gantry's fragmentation-aware scorer and baselines.

    python -m bench.openb --trace-dir ../shared/bench/openb --pods default --seeds 10 \
        --json out.json

Follows ``../shared/bench/openb/README.md``: every pod of the list plus pods sampled from it
(with replacement) until the requested GPU reaches 130% of capacity, shuffled per seed, placed
one at a time on the GPU-node list, no departures; a pod that fits nowhere is skipped.
Reports, when the arrived GPU request first reaches 80..130% of capacity, the allocated GPU
(milli-GPU) as % of capacity, and the fragmented GPU as % of capacity: the FGD measure (GPU
that the mix of pods arrived so far could not use, see ``scheduler.core.fragmentation``).
Mean and sample standard deviation over seeds. Gantry learns its mix online.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections import Counter
from multiprocessing import Pool
from pathlib import Path
from typing import Any

import numpy as np

from bench.openb.policies import POLICIES, ClusterState, make_policy
from bench.openb.trace import TRACES, load_nodes, load_pods, workload
from scheduler.core.fragmentation import expected_fragmentation

CHECKPOINTS = (80, 90, 100, 110, 120, 130)
DEFAULT_TRACE_DIR = Path(__file__).resolve().parents[3] / "shared" / "bench" / "openb"


def run_one(task: tuple[str, str, str, int, dict[str, Any]]) -> dict[str, Any]:
    """Replay one seed of one trace under one policy; figures per checkpoint."""
    trace_dir, trace, policy_name, seed, options = task
    nodes = load_nodes(Path(trace_dir))
    pods = workload(load_pods(Path(trace_dir), trace), nodes.capacity_milli, seed)
    state = ClusterState(nodes)
    policy = make_policy(policy_name, nodes, seed, options)
    capacity = nodes.capacity_milli
    arrived = allocated = skipped = 0
    seen: Counter[Any] = Counter()
    alloc: dict[str, float] = {}
    frag: dict[str, float] = {}
    started = time.perf_counter()
    for r in pods:
        policy.observe(r)
        seen[r] += 1
        arrived += r.total_gpu_milli
        cand = state.feasible(r)
        if len(cand):
            node = policy.choose(state, r, cand)
            devices = policy.devices(state, node, r)
            state.take(node, r, devices)
            policy.commit(node, r, devices)
            allocated += r.total_gpu_milli
        else:
            skipped += 1
        for x in CHECKPOINTS:
            if str(x) not in alloc and arrived >= x * capacity / 100:
                alloc[str(x)] = 100.0 * allocated / capacity
                frag[str(x)] = 100.0 * _fragmented(nodes.models, state, seen) / capacity
    elapsed = time.perf_counter() - started
    return {
        "trace": trace,
        "policy": policy_name,
        "seed": seed,
        "alloc": alloc,
        "frag": frag,
        "pods": len(pods),
        "skipped": skipped,
        "ms_per_pod": 1000.0 * elapsed / len(pods),
    }


def _fragmented(models: list[str], state: ClusterState, seen: Counter[Any]) -> float:
    per_node = expected_fragmentation(
        models, state.gpu_free, state.cpu_free, state.memory_free, list(seen.items())
    )
    return float(per_node.sum())


def summarise(runs: list[dict[str, Any]], trace: str, seeds: int) -> dict[str, Any]:
    policies: dict[str, Any] = {}
    for name in dict.fromkeys(r["policy"] for r in runs):
        mine = [r for r in runs if r["policy"] == name and r["trace"] == trace]
        policies[name] = {
            metric: {x: _stats([r[metric][x] for r in mine]) for x in mine[0][metric]}
            for metric in ("alloc", "frag")
        }
        policies[name]["skipped_pods"] = _stats([r["skipped"] for r in mine])
        policies[name]["ms_per_pod"] = _stats([r["ms_per_pod"] for r in mine])
    return {"trace": trace, "seeds": seeds, "policies": policies}


def _stats(values: list[float]) -> dict[str, float]:
    arr = np.array(values, dtype=np.float64)
    std = float(arr.std(ddof=1)) if len(arr) > 1 else 0.0
    return {"mean": round(float(arr.mean()), 4), "std": round(std, 4)}


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench.openb", description=__doc__.split("\n")[0])
    p.add_argument("--trace-dir", type=Path, default=DEFAULT_TRACE_DIR)
    p.add_argument("--pods", default="default", help=f"one of {', '.join(TRACES)}, or all")
    p.add_argument("--seeds", type=int, default=10)
    p.add_argument("--first-seed", type=int, default=0)
    p.add_argument("--policies", default=",".join(POLICIES))
    p.add_argument("--json", type=Path)
    p.add_argument("--jobs", type=int, default=2, help="worker processes")
    g = p.add_argument_group("gantry scorer options (scheduler.core.fragmentation)")
    g.add_argument("--step", type=float, default=100.0, help="step of the coarse score, milli")
    g.add_argument("--quantizer", default="step", choices=("step", "sigmoid", "exact"))
    g.add_argument("--tie-break", default="order", choices=("order", "bestfit"))
    g.add_argument("--coverage", type=float, default=0.95)
    g.add_argument("--half-life", type=float, default=None)
    g.add_argument("--cpu-only-step", type=float, default=0.0, help="<0: same as --step")
    g.add_argument("--cpu-only-to-busy", action=argparse.BooleanOptionalAction, default=True)
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    traces = list(TRACES) if args.pods == "all" else [args.pods]
    options = {
        "step_milli": args.step,
        "quantizer": args.quantizer,
        "tie_break": args.tie_break,
        "coverage": args.coverage,
        "half_life": args.half_life,
        "cpu_only_step": None if args.cpu_only_step < 0 else args.cpu_only_step,
        "cpu_only_to_busy": args.cpu_only_to_busy,
    }
    seeds = range(args.first_seed, args.first_seed + args.seeds)
    tasks = [
        (str(args.trace_dir), t, p, s, options)
        for t in traces
        for p in args.policies.split(",")
        for s in seeds
    ]
    runs = []
    with Pool(args.jobs) as pool:
        for done, run in enumerate(pool.imap_unordered(run_one, tasks), start=1):
            runs.append(run)
            print(
                f"[{done}/{len(tasks)}] {run['trace']} {run['policy']} seed={run['seed']} "
                f"alloc@100={run['alloc']['100']:.2f} alloc@130={run['alloc']['130']:.2f} "
                f"({run['ms_per_pod']:.2f} ms/pod)",
                file=sys.stderr,
                flush=True,
            )
    results = {t: summarise(runs, t, args.seeds) for t in traces}
    for result in results.values():
        _print_table(result)
    out: dict[str, Any] = (
        results[traces[0]]
        if len(traces) == 1
        else {
            "trace": "all",
            "seeds": args.seeds,
            "results": results,
        }
    )
    out["gantry_options"] = options
    if args.json:
        args.json.write_text(json.dumps(out, indent=2) + "\n")
    return 0


def _print_table(result: dict[str, Any]) -> None:
    print(f"\n{result['trace']} ({result['seeds']} seeds): GPU allocation % at arrived %")
    print("policy    " + "".join(f"{x:>15}" for x in CHECKPOINTS) + "   frag@100")
    for name, figures in result["policies"].items():
        cells = "".join(
            f"{figures['alloc'][str(x)]['mean']:>8.2f}±{figures['alloc'][str(x)]['std']:<5.2f} "
            for x in CHECKPOINTS
        )
        print(f"{name:<10}{cells}  {figures['frag']['100']['mean']:6.2f}")
