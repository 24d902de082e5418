"""Kueue's performance baseline end to end, on wall-clock time: jobs submitted to
PostgreSQL at their arrival times, scheduled by the real daemon, run by the simulated
cluster for their durations, reconciled as they finish.

    python -m bench.kueue_e2e --json out.json
    python -m bench.kueue_baseline --e2e --json out.json   # the same

The scenario of bench.kueue_baseline: 5 cohorts x 6 teams (20 GPUs guaranteed each, up to
120 borrowed within the cohort, nothing lent between cohorts), 75 nodes of 8 GPUs, 15,000
jobs: per team 350 small (1 GPU, 0.2 s, every 0.1 s, priority 50), 100 medium (5 GPUs,
0.5 s, every 0.5 s, priority 100), 50 large (5 x 4 GPUs, 1 s, every 1.2 s, priority 200).

Jobs are inserted in bulk by a submitter process every `--tick` seconds (queued rows as
`job_submit` writes them, without its per-request validation): submissions come from
outside the daemon's process, as they do through the API. Admission time is from a
job's insertion to its first `admitted` event; wall time from the first insertion to the
last job's success; usage is allocated GPU-time over 600 GPUs x wall time.
Kueue's published run: wall 351 s; admission small 215 s, medium 77 s, large 16.5 s.

`--load N` runs N busy processes (a bare Python loop each) beside the scenario: the daemon,
PostgreSQL and the submitter then share the cores with them, as on a loaded or slower host.
The output gives `host_loop_s`, the time a Python loop of 10 million additions took just
before the run, with the load running: the host's speed, to compare runs between windows.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import multiprocessing
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from bench.bench_profile import add_profile_argument, announced, bench_profile
from bench.daemon_setup import (
    DEFAULT_URL,
    forget_inherited_connections,
    fresh_database,
    job_rows,
    organisation,
)
from bench.kueue_baseline import NODES_PER_COHORT
from scheduler.core import Profile

COHORTS, TEAMS_PER_COHORT, FLAVOR = 5, 6, "gpu"
# class: (count, GPUs per replica, replicas, duration s, interval s, priority)
CLASSES = {
    "small": (350, 1, 1, 0.2, 0.1, 50),
    "medium": (100, 5, 1, 0.5, 0.5, 100),
    "large": (50, 4, 5, 1.0, 1.2, 250),
}
KUEUE = {
    "wall_s": 351.0,
    "admission_mean_s": {"small": 215.0, "medium": 77.0, "large": 16.5},
    "usage_pct": 55.9,
}


def scenario_teams(cohorts: int, flavor: str) -> list[tuple[str, str | None, dict[str, Any]]]:
    """The scenario's tenant tree for `organisation`: teams guaranteed 20 GPUs, borrowing up to
    120 within their cohort, cohorts lending nothing to each other, under one organisation
    that holds the whole cluster (15 nodes of 8 GPUs a cohort)."""
    total = cohorts * NODES_PER_COHORT * 8 * 1000
    teams: list[tuple[str, str | None, dict[str, Any]]] = [
        ("org", None, {flavor: (total, total, None)})
    ]
    for c in range(cohorts):
        teams.append((f"cohort-{c}", "org", {flavor: (120_000, 120_000, 0)}))
        teams += [
            (f"cohort-{c}-team-{t}", f"cohort-{c}", {flavor: (20_000, 120_000, None)})
            for t in range(TEAMS_PER_COHORT)
        ]
    return teams


def setup() -> tuple[dict[str, Any], dict[str, Any]]:
    from tenants.models import PriorityClass

    org = organisation(scenario_teams(COHORTS, FLAVOR))
    classes = {
        name: PriorityClass.objects.create(name=f"kueue-{name}", value=spec[5], may_preempt=True)
        for name, spec in CLASSES.items()
    }
    return org, classes


def job_specs(
    org: dict[str, Any], classes: dict[str, Any], per_class: int | None = None
) -> Iterator[tuple[int, str, dict[str, Any]]]:
    """(index in its class, class name, spec for `job_rows`) of every team's jobs: the
    scenario's counts, or `per_class` of each class."""
    for c in range(COHORTS):
        for t in range(TEAMS_PER_COHORT):
            team = org[f"cohort-{c}-team-{t}"]
            for name, (count, gpus, replicas, duration, _, _) in CLASSES.items():
                for i in range(count if per_class is None else per_class):
                    spec = {
                        "team": team,
                        "name": f"{name}-{c}-{t}-{i}",
                        "gpus": gpus,
                        "replicas": replicas,
                        "duration_s": duration,
                        "priority": classes[name],
                    }
                    yield i, name, spec


def arrivals(org: dict[str, Any], classes: dict[str, Any]) -> list[tuple[float, dict[str, Any]]]:
    out = [(round(i * CLASSES[name][4], 6), spec) for i, name, spec in job_specs(org, classes)]
    return sorted(out, key=lambda item: item[0])


def submitter(plan: list[tuple[float, dict[str, Any]]], tick: float, start: float) -> None:
    """The submitting process: inserts each job at its arrival time (`created_at` records
    it, and admission waits are measured from it)."""
    from django.db import connection
    from django.utils import timezone

    from scheduler.models import Job

    forget_inherited_connections()
    position = 0
    while position < len(plan):
        elapsed = time.time() - start
        due = []
        while position < len(plan) and plan[position][0] <= elapsed:
            due.append(plan[position][1])
            position += 1
        if due:
            Job.objects.bulk_create(job_rows(due, timezone.now()), batch_size=2000)
        time.sleep(max(0.0, tick - (time.time() - start - elapsed)))
    connection.close()


def run(
    tick: float,
    interval: float,
    limit_s: float,
    window: int,
    per_queue: int,
    cycles_log: Path | None = None,
    reasons_every_s: float = 1.0,
    profile: Profile | None = None,
) -> dict[str, Any]:
    from dataclasses import asdict

    from django.db import connections

    from scheduler.backends.simulated.cluster import SimulatedCluster
    from scheduler.backends.simulated.inventory import make_nodes
    from scheduler.daemon.loop import Daemon
    from scheduler.leader import Lease

    org, classes = setup()
    plan = arrivals(org, classes)
    backend = SimulatedCluster(make_nodes(75, FLAVOR, 8), start_delay_s=0.0, grace_cap_s=0.0)
    log: list[dict[str, Any]] = []
    cycles = 0

    def on_cycle(d: Daemon) -> None:
        """Record the cycle; stop the daemon once every job succeeded (or at the limit)."""
        nonlocal cycles
        cycles += 1
        if cycles_log and d.last is not None:
            log.append({"at": round(time.time() - start, 3), **asdict(d.last)})
        over = time.time() - start >= limit_s
        if over or (cycles % 10 == 0 and not process.is_alive() and not unfinished()):
            d.stop.set()

    # The daemon's own loop (`manage.py run_scheduler` runs the same): between cycles that
    # did nothing it waits for a NOTIFY (a job queued, an allocation ended), the simulated
    # cluster's next pod event, or `interval` (the polling fallback).
    profile = profile or bench_profile("no-min-runtime").profile
    daemon = Daemon(backend, lease=Lease(ttl_s=60), profile=profile,
                    interval_s=interval, max_pending=window, per_queue=per_queue,
                    sync_every_s=1.0, on_cycle=on_cycle,
                    reasons_every_s=reasons_every_s)  # fmt: skip
    daemon.lease.acquire()
    daemon.sync_nodes(force=True)
    connections.close_all()  # the forked submitter opens its own
    start = time.time()
    process = multiprocessing.get_context("fork").Process(
        target=submitter, args=(plan, tick, start), daemon=True
    )
    process.start()
    daemon.run()
    process.join()
    if cycles_log:
        cycles_log.write_text("".join(json.dumps(row) + "\n" for row in log))
    return figures(start, cycles)


def host_loop_s() -> float:
    """Seconds for a Python loop of 10 million additions: the host's speed as measured."""
    started, total = time.perf_counter(), 0
    for i in range(10_000_000):
        total += i
    return round(time.perf_counter() - started, 3)


def _spin() -> None:
    while True:
        pass


@contextlib.contextmanager
def busy_processes(count: int) -> Iterator[None]:
    """`count` processes that keep a core busy each, for the duration of the block."""
    spinners = [multiprocessing.get_context("fork").Process(target=_spin, daemon=True)
                for _ in range(count)]  # fmt: skip
    for process in spinners:
        process.start()
    try:
        yield
    finally:
        for process in spinners:
            process.kill()
            process.join()


def unfinished() -> bool:
    from scheduler.models import Job

    return Job.objects.exclude(state="succeeded").exists()


def figures(start: float, cycles: int) -> dict[str, Any]:
    from django.db.models import Min

    from scheduler.models import Allocation, Job, JobEvent

    jobs = {i: (name, created.timestamp()) for i, name, created in Job.objects.values_list(
        "id", "name", "created_at")}  # fmt: skip
    admitted = JobEvent.objects.filter(to_state="admitted").values("job_id").annotate(at=Min("at"))
    waits: dict[str, list[float]] = {name: [] for name in CLASSES}
    for row in admitted:
        name, created = jobs[row["job_id"]]
        waits[name.split("-")[0]].append(row["at"].timestamp() - created)
    last = Job.objects.filter(state="succeeded").order_by("-finished_at").first()
    wall = (last.finished_at.timestamp() - start) if last and last.finished_at else 0.0
    gpu_s = 0.0
    for began, ended, milli in Allocation.objects.filter(ended_at__isnull=False).values_list(
        "started_at", "ended_at", "gpu_milli"
    ):
        gpu_s += ((ended or began) - began).total_seconds() * milli / 1000
    return {
        "wall_s": round(wall, 1),
        "admission_mean_s": {c: round(sum(w) / len(w), 2) if w else None for c, w in waits.items()},
        "usage_pct": round(100 * gpu_s / (600 * wall), 1) if wall else 0.0,
        "jobs": len(jobs),
        "succeeded": Job.objects.filter(state="succeeded").count(),
        "preempted_events": JobEvent.objects.filter(to_state="preempted").count(),
        "cycles": cycles,
        "kueue_published": KUEUE,
        "lower_bound_s": 66.0,
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Kueue baseline through the daemon (PostgreSQL)")
    parser.add_argument("--tick", type=float, default=0.1, help="submitter period, s")
    parser.add_argument("--interval", type=float, default=2.0, help="daemon polling fallback, s")
    parser.add_argument("--limit", type=float, default=900.0, help="give up after, s")
    parser.add_argument("--window", type=int, default=500, help="queued jobs per cycle, at most")
    parser.add_argument("--per-queue", type=int, default=50, help="heads per team x class")
    parser.add_argument("--database-url", default=DEFAULT_URL)
    parser.add_argument("--json", type=Path)
    parser.add_argument("--cycles", type=Path, help="write each cycle's stats here (JSON lines)")
    parser.add_argument("--reasons-every", type=float, default=1.0, help="reason refresh, s")
    parser.add_argument(
        "--load", type=int, default=0, metavar="N", help="busy processes beside the run (0)"
    )
    add_profile_argument(parser, "no-min-runtime")
    args = parser.parse_args(argv)
    if args.load < 0:
        parser.error("--load must be 0 or more")
    loaded, used = announced(args.profile)
    fresh_database(args.database_url)
    with busy_processes(args.load):
        loop_s = host_loop_s()
        out = run(
            args.tick,
            args.interval,
            args.limit,
            args.window,
            args.per_queue,
            args.cycles,
            args.reasons_every,
            loaded.profile,
        )
    out |= {"load": args.load, "host_loop_s": loop_s, "profile": used}
    print(json.dumps(out, indent=2))
    if args.json:
        keys = ("wall_s", "admission_mean_s", "usage_pct", "profile")
        args.json.write_text(json.dumps({k: out[k] for k in keys}, indent=2) + "\n")


if __name__ == "__main__":
    main()
