"""Kueue's scheduler performance baseline, replayed on virtual time through the simulator.

    python -m bench.kueue_baseline --json out.json
    python -m bench.kueue_baseline --e2e --json out.json   # through the daemon: bench.kueue_e2e
    python -m bench.kueue_baseline --cycle-latency 0.06      # each cycle takes 60 ms

5 cohorts x 6 teams, each team guaranteed 20 GPUs and allowed to borrow 100 more inside its
cohort (cohorts lend nothing to each other), on 75 nodes of 8 GPUs (600 GPUs, the sum of
the guarantees). Per team: 350 small jobs (1 GPU, 200 ms, one every 100 ms, priority 50),
100 medium (5 GPUs, 500 ms, every 500 ms, priority 100), 50 large (20 GPUs, 1 s, every
1.2 s, priority 200): 15,000 jobs. Kueue checks quota only; Gantry also places every gang on
nodes, so a large job is a gang of 5 replicas x 4 GPUs (a node has 8) and a medium job one
replica of 5 GPUs. Preemption: lower priority within a team, reclaim within the cohort.

Reports makespan against the lower bound (total GPU-time over total guarantee:
30 x (350 x 0.2 + 100 x 2.5 + 50 x 20) / 600 = 66 s), mean time to admission per class and
usage (allocated GPU-time over guarantee x makespan). Kueue's published run: 351 s;
admission small 215 s, medium 77 s, large 16.5 s; usage 55.9%.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from bench.bench_profile import add_profile_argument, announced
from scheduler.core.types import JobRequest, Node, PriorityClass, Quota, Resources, Tenant
from scheduler.sim import Cluster, SimConfig, SimReport, WorkloadJob, simulate

FLAVOR = "gpu"
COHORTS, TEAMS_PER_COHORT = 5, 6
# class: (count, GPUs per replica, replicas, duration s, interval s, priority)
CLASSES = {
    "small": (350, 1, 1, 0.2, 0.1, 50),
    "medium": (100, 5, 1, 0.5, 0.5, 100),
    "large": (50, 4, 5, 1.0, 1.2, 200),
}
LOWER_BOUND_S = 66.0
KUEUE = {
    "makespan_s": 351.0,
    "admission_mean_s": {"small": 215.0, "medium": 77.0, "large": 16.5},
    "usage_pct": 55.9,
}


NODES_PER_COHORT = 15  # 75 nodes of 8 GPUs for the scenario's 5 cohorts


def cluster(cohorts: int = COHORTS) -> Cluster:
    nodes = tuple(
        Node.with_gpus(f"node-{i:02d}", FLAVOR, 8) for i in range(NODES_PER_COHORT * cohorts)
    )
    tenants = [Tenant("org")]
    for c in range(cohorts):
        cohort = f"cohort-{c}"
        tenants.append(Tenant(cohort, "org", {FLAVOR: Quota(120_000, 120_000, lend_limit=0)}))
        tenants.extend(
            Tenant(f"{cohort}-team-{t}", cohort, {FLAVOR: Quota(20_000, 120_000)})
            for t in range(TEAMS_PER_COHORT)
        )
    classes = tuple(PriorityClass(name, spec[5]) for name, spec in CLASSES.items())
    return Cluster(nodes, tuple(tenants), classes)


def workload() -> list[WorkloadJob]:
    jobs = []
    teams = [f"cohort-{c}-team-{t}" for c in range(COHORTS) for t in range(TEAMS_PER_COHORT)]
    for team in teams:
        for name, (count, gpus, replicas, duration, interval, _) in CLASSES.items():
            for i in range(count):
                request = JobRequest(
                    f"{team}-{name}-{i}",
                    team,
                    name,
                    Resources(gpu_milli=gpus * 1000),
                    replicas,
                    user=team,
                )
                jobs.append(WorkloadJob(request, round(i * interval, 6), duration))
    return jobs


def figures(report: SimReport) -> dict[str, object]:
    total_guarantee = COHORTS * TEAMS_PER_COHORT * 20
    used_gpu_s = sum(j.gpu_s for j in report.jobs)
    return {
        "makespan_s": round(report.makespan_s, 2),
        "lower_bound_s": LOWER_BOUND_S,
        "admission_mean_s": {c: round(report.wait_by_class[c].mean, 2) for c in CLASSES},
        "usage_pct": round(100 * used_gpu_s / (total_guarantee * report.makespan_s), 1),
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Kueue scheduler performance baseline")
    parser.add_argument("--json", type=Path)
    parser.add_argument(
        "--e2e",
        action="store_true",
        help="run it on wall-clock time through the daemon, PostgreSQL and the simulated "
        "cluster (bench.kueue_e2e; its options follow)",
    )
    parser.add_argument(
        "--cycle-latency",
        type=float,
        default=0.0,
        metavar="S",
        help="model a daemon's cycle time on virtual time: decisions take effect S seconds "
        "after their snapshot, and what happens meanwhile waits for the next cycle",
    )
    add_profile_argument(parser, "no-min-runtime")
    args, rest = parser.parse_known_args(argv)
    if args.e2e:
        if args.cycle_latency:
            parser.error("--cycle-latency models the daemon on virtual time; --e2e runs it")
        from bench import kueue_e2e

        json_args = ["--json", str(args.json)] if args.json else []
        kueue_e2e.main([*rest, "--profile", args.profile, *json_args])
        return
    if rest:
        parser.error(f"unrecognized arguments: {' '.join(rest)}")
    loaded, used = announced(args.profile)
    profile = loaded.profile
    started = time.perf_counter()
    config = SimConfig(tick_s=1.0, cycle_latency_s=args.cycle_latency)
    report = simulate(workload(), cluster(), profile, config=config)
    out = figures(report) | {"profile": used}
    useful_gpu_s = sum(
        w.duration_s * w.request.resources.gpu_milli / 1000 * w.request.replicas for w in workload()
    )
    extra = {
        "useful_usage_pct": round(100 * useful_gpu_s / (600 * report.makespan_s), 1),
        "admission_p99_s": {c: round(report.wait_by_class[c].p99, 2) for c in CLASSES},
        "jain_fairness": round(report.jain_fairness, 4),
        "kueue_published": KUEUE,
        "preemptions": report.preemptions,
        "cycles": report.cycles,
        "unfinished_jobs": sum(j.state != "succeeded" for j in report.jobs),
        "cycle_latency_s": args.cycle_latency,
        "wall_s": round(time.perf_counter() - started, 1),
    }
    print(json.dumps(out | extra, indent=2))
    if args.json:
        args.json.write_text(json.dumps(out, indent=2) + "\n")


if __name__ == "__main__":
    main()
