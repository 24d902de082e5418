"""Bind throughput of the whole daemon: database, engine and simulated backend.

    python -m bench.throughput --nodes 5000 --pods 10000 --json out.json

10,000 queued jobs (the mix of bench.core_throughput: 1 GPU 50%, 2 GPUs 20%, 4 GPUs 15%,
8 GPUs 10%, gangs of 2 x 8 GPUs 5%; ten teams whose guarantees split the cluster) on nodes
of 8 GPUs, through the real daemon (`Daemon.step`, leader lease, fenced bulk writes) on a
fresh PostgreSQL database. Reports pods bound per second from the first bind to the last,
per-job latency from queued to bound (p50, p99), and, in the same run, the rate of a bare
write path: the same number of allocation rows (and their device shares) written with no
scheduling, in the same bulk statements, then rolled back: the ceiling for this database.

The daemon takes at most `--batch` jobs per cycle (its `max_pending`), so binds from later
cycles overlap nothing: a cycle is snapshot -> decide -> claim -> bind -> commit. The loop
runs as in `Daemon.run` (`Daemon.running`): the queue estimates refresh in a worker process
of their own, on their own PostgreSQL session, whose CPU `cpu_s` (the daemon's process and
its session) leaves out.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import time
from pathlib import Path
from typing import Any

from bench.bench_profile import add_profile_argument, announced
from bench.daemon_setup import (
    DEFAULT_URL,
    fresh_database,
    job_rows,
    organisation,
    percentile,
    postgres_cpu_s,
)
from scheduler.core import Profile

MIX = ((1, 1, 0.50), (2, 1, 0.20), (4, 1, 0.15), (8, 1, 0.10), (8, 2, 0.05))  # gpus, replicas, p
TEAMS = 10
FLAVOR = "H100-80GB"


def setup(nodes: int, pods: int, seed: int) -> tuple[Any, list[int]]:
    from django.utils import timezone

    from scheduler.backends.simulated.cluster import SimulatedCluster
    from scheduler.backends.simulated.inventory import make_nodes
    from scheduler.models import Job
    from tenants.models import PriorityClass

    total = nodes * 8 * 1000
    share = total // TEAMS
    org = organisation(
        [("org", None, {FLAVOR: (total, total, None)})]
        + [(f"team-{t}", "org", {FLAVOR: (share, total, None)}) for t in range(TEAMS)]
    )
    normal = PriorityClass.objects.get(name="normal")
    rng = random.Random(seed)
    specs: list[dict[str, Any]] = []
    count = 0
    while count < pods:
        gpus, replicas, _ = rng.choices(MIX, weights=[m[2] for m in MIX])[0]
        team = org[f"team-{rng.randrange(TEAMS)}"]
        specs.append(
            {
                "team": team,
                "name": f"job-{len(specs)}",
                "gpus": gpus,
                "replicas": replicas,
                "duration_s": 3600,
                "priority": normal,
            }
        )
        count += replicas
    Job.objects.bulk_create(job_rows(specs, timezone.now()), batch_size=2000)
    backend = SimulatedCluster(make_nodes(nodes, FLAVOR, 8, prefix="n"), start_delay_s=3600)
    return backend, list(Job.objects.values_list("id", flat=True))


def bare_writes(job_ids: list[int], pods: int) -> float:
    """Allocation + device-share rows for `pods` pods through the daemon's own insert
    (`insert_allocations`: COPY on PostgreSQL, trigger included), timed, rolled back."""
    from django.db import transaction
    from django.utils import timezone

    from scheduler.daemon.store import insert_allocations
    from scheduler.models import GpuDevice

    devices = list(GpuDevice.objects.order_by("id").values_list("id", "node_id")[:pods])
    now = timezone.now()
    started = time.perf_counter()
    with transaction.atomic():
        rows = [
            (
                job_ids[i % len(job_ids)],
                node,
                0,
                i,
                f"bare-{i}",
                "bare",
                "",
                1000,
                False,
                0,
                now,
                "",
            )
            for i, (_, node) in enumerate(devices)
        ]
        insert_allocations(rows, [[(device, 1000, 0)] for device, _ in devices])
        elapsed = time.perf_counter() - started
        transaction.set_rollback(True)
    return len(devices) / elapsed


def run(nodes: int, pods: int, batch: int, seed: int, profile: Profile) -> dict[str, Any]:
    from django.utils import timezone

    from scheduler.daemon.loop import Daemon
    from scheduler.leader import Lease
    from scheduler.models import Job, JobEvent

    backend, job_ids = setup(nodes, pods, seed)
    daemon = Daemon(
        backend, lease=Lease(ttl_s=120), profile=profile, max_pending=batch, sync_every_s=1.0
    )
    daemon.lease.acquire()
    daemon.sync_nodes(force=True)  # the inventory, before anything is measured
    bare = bare_writes(job_ids, pods)
    binds: list[float] = []
    bind = backend.bind_pod

    def timed_bind(namespace: str, name: str, node: str) -> None:
        bind(namespace, name, node)
        binds.append(time.time())

    backend.bind_pod = timed_bind  # type: ignore[method-assign]
    Job.objects.update(queued_at=timezone.now())  # every job arrives now
    load_before = os.getloadavg()[0]
    cpu_daemon, cpu_pg = time.process_time(), postgres_cpu_s()
    started = time.time()
    cycles: list[dict[str, float]] = []
    with daemon.running():  # as `Daemon.run`: the estimates in their own process
        while Job.objects.filter(state="queued").exists() and len(cycles) < 1000:
            daemon.step()
            if daemon.last is not None:
                cycles.append(daemon.last.phases_ms)
    finished = time.time()
    cpu_daemon, cpu_pg = time.process_time() - cpu_daemon, postgres_cpu_s() - cpu_pg
    queued_at = dict(Job.objects.values_list("id", "queued_at"))
    bound = {}
    for job_id, at in JobEvent.objects.filter(to_state="binding").values_list("job_id", "at"):
        bound[job_id] = (at - (queued_at[job_id] or at)).total_seconds() * 1000
    latencies = list(bound.values())
    phases = {k: round(sum(c.get(k, 0) for c in cycles) / 1000, 2) for k in cycles[0]}
    return {
        "pods_per_s": round(len(binds) / max(binds[-1] - binds[0], 1e-9), 1),
        "bare_write_per_s": round(bare, 1),
        "latency_ms": {
            "p50": round(percentile(latencies, 50), 1),
            "p99": round(percentile(latencies, 99), 1),
        },
        "pods_bound": len(binds),
        "jobs_bound": len(bound),
        "jobs_left_queued": Job.objects.filter(state="queued").count(),
        "end_to_end_pods_per_s": round(len(binds) / (finished - started), 1),
        "cycles": len(cycles),
        "batch": batch,
        "phase_totals_s": phases,
        "nodes": nodes,
        # The machine is shared: CPU time says what the run cost whatever else ran.
        "cpu_s": {"daemon": round(cpu_daemon, 1), "postgres": round(cpu_pg, 1)},
        "pods_per_cpu_s": round(len(binds) / max(cpu_daemon + cpu_pg, 1e-9), 1),
        "load_average": [round(load_before, 1), round(os.getloadavg()[0], 1)],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description="Daemon bind throughput (PostgreSQL)")
    parser.add_argument("--nodes", type=int, default=5000)
    parser.add_argument("--pods", type=int, default=10000)
    parser.add_argument("--batch", type=int, default=2000, help="jobs per cycle at most")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--database-url", default=DEFAULT_URL)
    parser.add_argument("--json", type=Path)
    add_profile_argument(parser, "default")
    args = parser.parse_args()
    loaded, used = announced(args.profile)
    fresh_database(args.database_url)
    out = run(args.nodes, args.pods, args.batch, args.seed, loaded.profile)
    out["profile"] = used
    print(json.dumps(out, indent=2))
    if args.json:
        args.json.write_text(json.dumps(out, indent=2) + "\n")


if __name__ == "__main__":
    main()
