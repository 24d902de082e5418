"""The daemon's cost per cycle at the Kueue scenario's scale, on a virtual clock.

    python -m bench.daemon_cycle --json out.json

The organisation, cluster and job classes of bench.kueue_e2e (30 teams, 75 nodes of 8 GPUs),
with every team's jobs queued at once (`--jobs-per-team` of each class), run by the real
daemon on PostgreSQL and the simulated cluster, on a clock that only the benchmark moves.
After a warm-up that fills the cluster it measures, in the same run:

- quiet cycles: the clock stands still, nothing changes (the floor of a cycle's cost);
- busy cycles: the clock moves `--step` seconds before each cycle, so that jobs end, are
  reconciled and replaced, as in the scenario's first minute.

Reports the mean and median wall time of each kind, the CPU time per cycle of the daemon
and of its PostgreSQL connection (steadier than wall time when the machine is shared),
and the phases' means. Unlike the
scenario on wall-clock time, the same code gives the same cycles in every run, so the
figure compares versions of the daemon to within a few percent (run both in one window:
this machine's speed moves).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path
from typing import Any

from bench.bench_profile import add_profile_argument, announced
from bench.daemon_setup import DEFAULT_URL, fresh_database, job_rows, postgres_cpu_s
from scheduler.core import Profile


def queue_all(org: dict[str, Any], classes: dict[str, Any], per_team: int) -> int:
    from django.utils import timezone

    from bench.kueue_e2e import job_specs
    from scheduler.models import Job

    specs = [spec for _, _, spec in job_specs(org, classes, per_team)]
    Job.objects.bulk_create(job_rows(specs, timezone.now()), batch_size=2000)
    return len(specs)


def measure(
    per_team: int, cycles: int, step: float, warmup: int, profile: Profile
) -> dict[str, Any]:
    from bench.kueue_e2e import FLAVOR, setup
    from scheduler.backends.simulated.cluster import SimulatedCluster
    from scheduler.backends.simulated.inventory import make_nodes
    from scheduler.daemon.loop import Daemon
    from scheduler.leader import Lease

    org, classes = setup()
    queued = queue_all(org, classes, per_team)
    now = [time.time()]

    def clock() -> float:
        return now[0]

    backend = SimulatedCluster(
        make_nodes(75, FLAVOR, 8), clock=clock, start_delay_s=0.0, grace_cap_s=0.0
    )
    daemon = Daemon(backend, lease=Lease(ttl_s=3600), profile=profile,
                    clock=clock, max_pending=500, per_queue=50,
                    sync_every_s=3600.0)  # fmt: skip
    daemon.lease.acquire()
    daemon.sync_nodes(force=True)
    for _ in range(warmup):
        now[0] += step
        daemon.step()

    def run(advance: float) -> dict[str, Any]:
        took, phases, placed = [], [], 0
        cpu, db_cpu = time.process_time(), postgres_cpu_s()
        for _ in range(cycles):
            now[0] += advance
            started = time.perf_counter()
            daemon.step()
            took.append(1000 * (time.perf_counter() - started))
            assert daemon.last is not None
            phases.append(daemon.last.phases_ms)
            placed += daemon.last.placed
        cpu, db_cpu = time.process_time() - cpu, postgres_cpu_s() - db_cpu
        names = phases[0].keys()
        return {
            "mean_ms": round(statistics.fmean(took), 2),
            "daemon_cpu_ms": round(1000 * cpu / cycles, 2),
            "postgres_cpu_ms": round(1000 * db_cpu / cycles, 2),
            "median_ms": round(statistics.median(took), 2),
            "placed_per_cycle": round(placed / cycles, 1),
            "phases_ms": {
                n: round(statistics.fmean(p.get(n, 0.0) for p in phases), 2) for n in names
            },
        }

    quiet = run(0.0)
    busy = run(step)
    return {"queued": queued, "cycles": cycles, "step_s": step, "quiet": quiet, "busy": busy}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="The daemon's cost per cycle (PostgreSQL)")
    parser.add_argument("--jobs-per-team", type=int, default=60, help="of each class")
    parser.add_argument("--cycles", type=int, default=150, help="measured, of each kind")
    parser.add_argument("--step", type=float, default=0.1, help="virtual s between busy cycles")
    parser.add_argument("--warmup", type=int, default=30)
    parser.add_argument("--database-url", default=DEFAULT_URL)
    parser.add_argument("--json", type=Path)
    add_profile_argument(parser, "no-min-runtime")
    args = parser.parse_args(argv)
    loaded, used = announced(args.profile)
    fresh_database(args.database_url)
    out = measure(args.jobs_per_team, args.cycles, args.step, args.warmup, loaded.profile)
    out["profile"] = used
    print(json.dumps(out, indent=2))
    if args.json:
        args.json.write_text(json.dumps(out, indent=2) + "\n")


if __name__ == "__main__":
    main()
