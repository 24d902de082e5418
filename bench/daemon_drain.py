"""The Kueue scenario's last phase, alone: the daemon drains a queue on wall-clock time.

    python -m bench.daemon_drain --json out.json

In `bench.kueue_e2e` the teams' large gangs arrive every 1.2 s and take the whole cluster
for 1 s. As soon as the daemon needs more than the 0.2 s between two waves to replace one
wave by the next, the waves run back to back and the medium and small jobs wait for the
last large one (about 58 s in). What follows is this phase: 3,000 medium jobs (5 GPUs,
0.5 s) and 10,500 small ones (1 GPU, 0.2 s) on 75 nodes of 8 GPUs. Its floor is the
mediums' (one per node: 3,000 x 0.5 s / 75 = 20 s), reached only if the daemon places and
reconciles about 700 jobs a second; below that the phase lasts jobs x the daemon's cost
per job, its own CPU time and its PostgreSQL session's, spent one after the other.

Queues those jobs at once (the organisation and classes of bench.kueue_e2e, `--per-team`
of each class to run a smaller phase), runs the real daemon on PostgreSQL and the
simulated cluster on the wall clock (waiting for the cluster's next pod event when a cycle
had nothing to do), and reports the drain time, jobs per second, the CPU per job of the
daemon and of its PostgreSQL session, and each phase's wall time per job.
"""

from __future__ import annotations

import argparse
import gc
import json
import time
from pathlib import Path
from typing import Any

from bench.bench_profile import add_profile_argument, announced, bench_profile
from bench.daemon_setup import DEFAULT_URL, fresh_database, job_rows, postgres_cpu_s
from scheduler.core import Profile

MEDIUM_FLOOR_S = 3000 * 0.5 / 75


def queue(per_team: dict[str, int]) -> int:
    from django.utils import timezone

    from bench.kueue_e2e import job_specs, setup
    from scheduler.models import Job

    org, classes = setup()
    most = max(per_team.values())
    specs = [
        spec
        for i, name, spec in job_specs(org, classes, most)
        if name in per_team and i < per_team[name]
    ]
    Job.objects.bulk_create(job_rows(specs, timezone.now()), batch_size=2000)
    return len(specs)


def drain(
    per_team: dict[str, int], limit_s: float, window: int = 500, profile: Profile | None = None
) -> dict[str, Any]:
    from bench.kueue_e2e import FLAVOR
    from scheduler.backends.simulated.cluster import SimulatedCluster
    from scheduler.backends.simulated.inventory import make_nodes
    from scheduler.daemon.loop import Daemon
    from scheduler.daemon.phases import collector_for_the_loop
    from scheduler.leader import Lease, daemon_sessions
    from scheduler.models import Job

    jobs = queue(per_team)
    backend = SimulatedCluster(make_nodes(75, FLAVOR, 8), start_delay_s=0.0, grace_cap_s=0.0)
    profile = profile or bench_profile("no-min-runtime").profile
    daemon = Daemon(backend, lease=Lease(ttl_s=600), profile=profile,
                    max_pending=window, per_queue=50, sync_every_s=600.0)  # fmt: skip
    daemon.lease.acquire()
    daemon.sync_nodes(force=True)
    phases: dict[str, float] = {}
    cycles = placed = 0
    started, cpu, db_cpu = time.time(), time.process_time(), postgres_cpu_s()
    collector = _CollectorClock()
    # As in the daemon's own loop: its collector settings and its sessions' settings.
    with collector_for_the_loop(), daemon_sessions(), collector:
        while time.time() - started < limit_s:
            again = daemon.step()  # as `Daemon.run`: at once, or after the next pod event
            assert daemon.last is not None
            cycles += 1
            placed += daemon.last.placed
            for name, ms in daemon.last.phases_ms.items():
                phases[name] = phases.get(name, 0.0) + ms
            if cycles % 20 == 0 and not Job.objects.exclude(state="succeeded").exists():
                break
            if not again:
                at = backend.next_event_at()
                if at is not None and at > time.time():
                    time.sleep(at - time.time() + 0.002)
    wall = time.time() - started
    cpu, db_cpu = time.process_time() - cpu, postgres_cpu_s() - db_cpu
    left = Job.objects.exclude(state="succeeded").count()
    return {
        "jobs": jobs,
        "drain_s": round(wall, 2),
        "unfinished": left,
        "jobs_per_s": round(jobs / wall, 1),
        "medium_floor_s": MEDIUM_FLOOR_S if per_team.get("medium") == 100 else None,
        "cycles": cycles,
        "placed": placed,
        "daemon_cpu_ms_per_job": round(1000 * cpu / jobs, 3),
        "postgres_cpu_ms_per_job": round(1000 * db_cpu / jobs, 3),
        "gc_s": round(collector.seconds, 2),
        "phases_ms_per_job": {n: round(ms / jobs, 3) for n, ms in phases.items()},
    }


class _CollectorClock:
    """Time spent in Python's garbage collector while in the block (`gc.callbacks`)."""

    def __init__(self) -> None:
        self.seconds, self._at = 0.0, 0.0

    def _tick(self, phase: str, _info: dict[str, Any]) -> None:
        if phase == "start":
            self._at = time.perf_counter()
        else:
            self.seconds += time.perf_counter() - self._at

    def __enter__(self) -> None:
        gc.callbacks.append(self._tick)

    def __exit__(self, *exc: object) -> None:
        gc.callbacks.remove(self._tick)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="The daemon drains the tail of bench.kueue_e2e")
    parser.add_argument("--per-team", type=int, help="jobs of each class per team (100/350)")
    parser.add_argument("--limit", type=float, default=300.0, help="give up after, s")
    parser.add_argument("--window", type=int, default=500, help="queued jobs per cycle, at most")
    parser.add_argument("--database-url", default=DEFAULT_URL)
    parser.add_argument("--json", type=Path)
    add_profile_argument(parser, "no-min-runtime")
    args = parser.parse_args(argv)
    loaded, used = announced(args.profile)
    fresh_database(args.database_url)
    counts = {"medium": 100, "small": 350}
    if args.per_team:
        counts = dict.fromkeys(counts, args.per_team)
    out = drain(counts, args.limit, args.window, loaded.profile)
    out["profile"] = used
    print(json.dumps(out, indent=2))
    if args.json:
        args.json.write_text(json.dumps(out, indent=2) + "\n")


if __name__ == "__main__":
    main()
