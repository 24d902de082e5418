"""openb through the engine: the published protocol replayed through `run_cycle`'s own placer.

`python -m bench.openb` measures the fragmentation model alone and the baselines; this bench
checks that the engine, with its plugin weights and tie-breaks, keeps the gain. Same protocol
and workload (`bench.openb.trace`), the FGD mix learned online as requests arrive, and the
same JSON shape: ``{"trace", "seeds", "policies": {"engine": {"alloc": {...}}, "engine-bestfit":
...}}``, the allocation ratio (% of GPU capacity) when 80..130 % of it has arrived.

    python -m bench.engine_openb --pods default --seeds 10 --json out.json
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

from bench.bench_profile import bench_profile, profile_output
from bench.openb import CHECKPOINTS, DEFAULT_TRACE_DIR, _stats
from bench.openb.trace import TRACES, Nodes, load_nodes, load_pods, workload
from scheduler.core.fragmentation import PodRequest
from scheduler.core.types import Device, Node, Resources
from scheduler.sim import replay_placements

# policy -> its profile in bench/profiles/
PROFILES = {
    "engine": "default",  # fragmentation-aware scoring
    "engine-bestfit": "bestfit",
}


def engine_nodes(nodes: Nodes) -> list[Node]:
    return [
        Node(name, model, tuple(Device(i, 0) for i in range(count)), cpu, memory)
        for name, model, count, cpu, memory in zip(
            nodes.names,
            nodes.models,
            nodes.gpu_count,
            nodes.cpu_milli,
            nodes.memory_mib,
            strict=True,
        )
    ]


def engine_request(pod: PodRequest) -> tuple[Resources, tuple[str, ...]]:
    # Whole GPUs as a multiple of 1000, a share below it: the engine's convention.
    resources = Resources(gpu_milli=pod.total_gpu_milli, cpu_milli=pod.cpu_milli,
                          memory_mib=pod.memory_mib)  # fmt: skip
    return resources, tuple(sorted(pod.gpu_models))


def run_one(task: tuple[str, str, str, int]) -> dict[str, Any]:
    trace_dir, trace, name, seed = task
    nodes = load_nodes(Path(trace_dir))
    pods = workload(load_pods(Path(trace_dir), trace), nodes.capacity_milli, seed)
    profile = bench_profile(PROFILES[name]).profile
    capacity = nodes.capacity_milli
    arrived = allocated = 0
    alloc: dict[str, float] = {}
    started = time.perf_counter()
    requests = [engine_request(p) for p in pods]
    for pod, placed in zip(pods, replay_placements(engine_nodes(nodes), requests, profile),
                           strict=True):  # fmt: skip
        arrived += pod.total_gpu_milli
        if placed is not None:
            allocated += pod.total_gpu_milli
        for x in CHECKPOINTS:
            if str(x) not in alloc and arrived >= x * capacity / 100:
                alloc[str(x)] = 100.0 * allocated / capacity
    elapsed = time.perf_counter() - started
    return {"policy": name, "seed": seed, "alloc": alloc,
            "ms_per_pod": 1000.0 * elapsed / len(pods)}  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.engine_openb")
    p.add_argument("--trace-dir", type=Path, default=DEFAULT_TRACE_DIR)
    p.add_argument("--pods", default="default", choices=TRACES)
    p.add_argument("--seeds", type=int, default=10)
    p.add_argument("--jobs", type=int, default=2, help="worker processes")
    p.add_argument("--json", type=Path)
    args = p.parse_args(argv)
    used = {name: profile_output(bench_profile(file)) for name, file in PROFILES.items()}
    for name, record in used.items():
        print(
            f"bench: {name} runs profile {record['name']!r} from {record['file']}", file=sys.stderr
        )
    tasks = [(str(args.trace_dir), args.pods, name, seed)
             for name in PROFILES for seed in range(args.seeds)]  # fmt: skip
    runs = []
    with ProcessPoolExecutor(max_workers=args.jobs) as pool:
        for done, run in enumerate(pool.map(run_one, tasks), start=1):
            runs.append(run)
            at_100 = run["alloc"].get("100", 0.0)
            progress = f"[{done}/{len(tasks)}] {run['policy']} seed {run['seed']}: {at_100:.2f}%"
            print(progress, file=sys.stderr)
    policies = {
        name: {
            "alloc": {
                str(x): _stats([r["alloc"][str(x)] for r in runs if r["policy"] == name])
                for x in CHECKPOINTS
            },
            "ms_per_pod": _stats([r["ms_per_pod"] for r in runs if r["policy"] == name]),
            "profile": used[name],
        }
        for name in PROFILES
    }
    out = {"trace": args.pods, "seeds": args.seeds, "policies": policies}
    text = json.dumps(out, indent=2)
    if args.json:
        args.json.write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
