"""One cold cycle: N pending single- and multi-GPU jobs onto M empty nodes of 8 GPUs.

    python -m bench.core_throughput --nodes 5000 --pods 10000 --json out.json

Reports placements per second (jobs placed over the cycle's wall time) and the time split by
phase, as ``run_cycle`` announces its phases. ``--warm-pending N`` also times a warm cycle:
the cold cycle's jobs running, N new ones arriving, half of a higher class (it preempts).
The job mix (seeded): 1 GPU 50%, 2 GPUs 20%, 4 GPUs 15%, 8 GPUs 10%, gangs of 2 x 8 GPUs
5%; ten teams whose guarantees split the cluster. ``--clusters K`` deals the nodes round-robin
to K clusters (docs/multicluster.md: a gang runs in one).
"""

from __future__ import annotations

import argparse
import json
import random
import time
from dataclasses import replace
from pathlib import Path

from bench.bench_profile import add_profile_argument, announced
from scheduler.core import Profile, run_cycle
from scheduler.core.types import (
    JobRequest,
    Node,
    PriorityClass,
    Quota,
    Resources,
    RunningJob,
    Snapshot,
    Tenant,
)

MIX = ((1, 1, 0.50), (2, 1, 0.20), (4, 1, 0.15), (8, 1, 0.10), (8, 2, 0.05))  # gpus, replicas, p
TEAMS = 10


def build_snapshot(nodes: int, pods: int, seed: int, clusters: int = 1) -> Snapshot:
    """With `clusters` > 1 the nodes are dealt round-robin to that many clusters
    (`gantry.io/cluster`: every gang must then fit in one)."""
    rng = random.Random(seed)
    cluster = tuple(
        Node.with_gpus(f"node-{i:05d}", "H100", 8, labels=_labels(i, clusters))
        for i in range(nodes)
    )
    share = nodes * 8 * 1000 // TEAMS
    teams = [Tenant(f"team-{t}", "org", {"H100": Quota(share, nodes * 8000)}) for t in range(TEAMS)]
    tenants = (Tenant("org"), *teams)
    classes = (PriorityClass("normal", 100),)
    weights = [p for _, _, p in MIX]
    jobs = []
    for i in range(pods):
        gpus, replicas, _ = rng.choices(MIX, weights)[0]
        resources = Resources(gpu_milli=gpus * 1000, cpu_milli=4000 * gpus, memory_mib=32_768)
        jobs.append(
            JobRequest(
                f"job-{i:05d}",
                f"team-{i % TEAMS}",
                "normal",
                resources,
                replicas,
                submitted_at=float(i) / 1000,
            )
        )
    return Snapshot(3600.0, cluster, tenants, classes, (), tuple(jobs))


def _labels(i: int, clusters: int) -> dict[str, str]:
    labels = {"gantry.io/rack": f"rack-{i // 32}"}
    return labels if clusters <= 1 else {**labels, "gantry.io/cluster": f"c{i % clusters}"}


def measure(
    nodes: int, pods: int, seed: int = 1, profile: Profile | None = None, clusters: int = 1
) -> dict[str, object]:
    profile = profile or Profile()
    snapshot = build_snapshot(nodes, pods, seed, clusters)
    marks: list[tuple[str, float]] = []
    start, cpu_start = time.perf_counter(), time.process_time()
    result = run_cycle(
        snapshot, profile, on_phase=lambda name: marks.append((name, time.perf_counter()))
    )
    total = time.perf_counter() - start
    cpu = time.process_time() - cpu_start
    phases = {name: round(marks[i + 1][1] - t, 4) for i, (name, t) in enumerate(marks[:-1])}
    placed = len(result.placements)
    replicas = sum(len(p.assignments) for p in result.placements)
    return {
        "placements_per_s": round(placed / total, 1),
        "pods_per_s": round(replicas / total, 1),
        "phases_s": phases,
        "cycle_s": round(total, 3),
        # CPU time of this process: the figure to trust on a machine shared with other work
        "cycle_cpu_s": round(cpu, 3),
        "placements_per_cpu_s": round(placed / cpu, 1),
        "nodes": nodes,
        "jobs": pods,
        "placed_jobs": placed,
        "placed_pods": replicas,
        "waiting": len(result.waiting),
        "clusters": clusters,
    }


def measure_warm(
    nodes: int,
    pods: int,
    pending: int,
    seed: int = 1,
    profile: Profile | None = None,
    now: float = 7200.0,
) -> dict[str, object]:
    """A warm cycle: the cold cycle's placements run (started at 0); ``pending`` new jobs
    arrive, half of them of a higher class, so the cycle preempts (within tenants, and
    reclaims). ``now`` inside the minimum runtime: nothing may be preempted yet, and the
    jobs that could preempt later are told their planned preemption (``plans.plan_later``)."""
    profile = profile or Profile()
    cold = build_snapshot(nodes, pods, seed)
    classes = (PriorityClass("normal", 100), PriorityClass("high", 200))
    cold = replace(cold, priority_classes=classes)
    by_id = {j.id: j for j in cold.pending}
    running = tuple(
        RunningJob(by_id[p.job_id], p.flavor, p.assignments, 0.0)
        for p in run_cycle(cold, profile).placements
    )
    rng = random.Random(seed)
    new = tuple(
        replace(
            j, id=f"new-{i}", priority_class=rng.choice(["normal", "high"]), submitted_at=3000.0 + i
        )
        for i, j in enumerate(cold.pending[:pending])
    )
    warm = replace(cold, now=now, running=running, pending=new)
    start, cpu_start = time.perf_counter(), time.process_time()
    result = run_cycle(warm, profile)
    return {
        "running": len(running),
        "pending": len(new),
        "placed": len(result.placements),
        "preemptions": len(result.preemptions),
        "planned": sum(1 for w in result.waiting if w.plan is not None),
        "cycle_s": round(time.perf_counter() - start, 3),
        "cycle_cpu_s": round(time.process_time() - cpu_start, 3),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--nodes", type=int, default=5000)
    parser.add_argument("--pods", type=int, default=10000)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--json", type=Path)
    parser.add_argument(
        "--warm-pending",
        type=int,
        default=0,
        help="also time a warm cycle with this many new jobs (preemption-heavy)",
    )
    parser.add_argument(
        "--warm-now",
        type=float,
        default=7200.0,
        help="the warm cycle's time; below the minimum runtime (300) it plans, not preempts",
    )
    parser.add_argument(
        "--clusters", type=int, default=1, help="deal the nodes to this many clusters"
    )
    add_profile_argument(parser, "default")
    args = parser.parse_args()
    loaded, used = announced(args.profile)
    figures = measure(args.nodes, args.pods, args.seed, loaded.profile, args.clusters)
    if args.warm_pending:
        figures["warm"] = measure_warm(
            args.nodes, args.pods, args.warm_pending, args.seed, loaded.profile, args.warm_now
        )
    figures["profile"] = used
    print(json.dumps(figures, indent=2))
    if args.json:  # the shape; the rest is on stdout
        shape = {key: figures[key] for key in ("placements_per_s", "phases_s", "profile")}
        args.json.write_text(json.dumps(shape, indent=2) + "\n")


if __name__ == "__main__":
    main()
