"""The dashboards' data requests over a month of history of a large cluster.

    python -m bench.dashboards --gpus 1000 --days 30 --json out.json
        [--raw-hours 2] [--interval-s 30] [--repeat 20] [--url postgres://...]

Builds a fresh PostgreSQL database with `--gpus` devices (two flavors, nodes of 8, lanes of
4 devices), eight teams under two departments, and `--days` of history:

- the last `--raw-hours` hours as raw samples of every device every `--interval-s` seconds,
  written through the real ingest path (`samples_ingest`, one call per node as the agents
  report) and rolled up by the real `rollup_run`: `ingest_samples_per_s` is measured there;
- the days before as roll-up rows written directly (COPY): 5-minute and hourly, per device,
  job, tenant and flavor, as `rollup_run` would have left them. A month of samples of 1,000
  GPUs every 30 s is 86 million rows, which raw retention (48 h) would have deleted anyway,
  and ingesting them would take this machine hours; the dashboards read only roll-ups, and
  those are all there, at both grains, for every device and day;
- jobs one after another on each lane (2 to 12 hours, some idle), their failure and
  preemption events, their idle totals, and the queue's 5-minute snapshots.

Then times each dashboard's data (the selectors the portal's views call,
scheduler/telemetry/dashboards.py) `--repeat` times per range and reports the 95th percentile, in
ms, per dashboard (cluster, tenant, job) at its slowest range. The JSON says what was ingested.
"""

from __future__ import annotations

import argparse
import json
import random
import time
from collections import defaultdict
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import numpy as np

from bench.daemon_setup import fresh_database, organisation

DEFAULT_URL = "postgres://postgres@127.0.0.1:5432/gantry_bench_dashboards"
FLAVORS = ("H100-80GB", "A100-80GB")
LANE = 4  # devices per job
DEPARTMENTS = {
    "research": ["nlp", "vision", "speech", "rl"],
    "product": ["search", "ads", "recs", "chat"],
}
FIVE, HOUR = timedelta(minutes=5), timedelta(hours=1)


@dataclass(frozen=True)
class Planned:
    """A job on a lane of devices: from `start` to `end` at `util` % (under 5 %: idle)."""

    lane: int
    team: str
    start: datetime
    end: datetime
    util: float
    failed: str = ""  # the reason of a failed attempt, if it had one


def plan(lanes: int, start: datetime, end: datetime, seed: int) -> list[Planned]:
    """Jobs back to back on each lane with gaps; each lane's last job runs until `end`."""
    rng = random.Random(seed)
    teams = [t for members in DEPARTMENTS.values() for t in members]
    reasons = ["OOMKilled", "ImagePullBackOff", "NCCL timeout", "exit code 1"]
    jobs = []
    for lane in range(lanes):
        at = start - timedelta(hours=rng.uniform(0, 6))
        while at < end:
            length = timedelta(hours=rng.uniform(2, 12))
            util = rng.choice([92.0, 92.0, 85.0, 60.0, 35.0, 2.0])
            failed = rng.choice(reasons) if rng.random() < 0.08 else ""
            jobs.append(Planned(lane, rng.choice(teams), at, min(at + length, end), util, failed))
            at += length + timedelta(minutes=rng.uniform(0, 60))
    return jobs


def _line(row: tuple[Any, ...]) -> str:
    return "\t".join("\\N" if v is None else str(v) for v in row)


def _copy(table: str, columns: Sequence[str], rows: Iterable[tuple[Any, ...]]) -> int:
    """Rows into `table`: on PostgreSQL with COPY, in blocks of text, its indexes dropped
    for the load and made again after it (one sorted build instead of millions of index
    inserts: the table ends with the same indexes); multi-row inserts elsewhere."""
    from django.db import connection

    n = 0
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            cursor.execute("SET statement_timeout = 0")  # a load, not a request
            statement = f"COPY {table} ({', '.join(columns)}) FROM STDIN"
            with _without_indexes(cursor, table), cursor.cursor.copy(statement) as copy:
                block: list[str] = []
                for row in rows:
                    block.append(_line(row))
                    n += 1
                    if len(block) == 20000:
                        copy.write("\n".join(block) + "\n")
                        block = []
                if block:
                    copy.write("\n".join(block) + "\n")
            cursor.execute("RESET statement_timeout")
            return n
        marks = ", ".join(["%s"] * len(columns))
        sql = f"INSERT INTO {table} ({', '.join(columns)}) VALUES ({marks})"  # noqa: S608
        batch: list[tuple[Any, ...]] = []
        for row in rows:
            batch.append(
                tuple(str(v.replace(tzinfo=None)) if isinstance(v, datetime) else v for v in row)
            )
            n += 1
            if len(batch) == 5000:
                cursor.executemany(sql, batch)
                batch = []
        if batch:
            cursor.executemany(sql, batch)
    return n


@contextmanager
def _without_indexes(cursor: Any, table: str) -> Iterator[None]:
    """Drop `table`'s indexes and unique constraints (not its primary key), then make them
    again as they were."""
    cursor.execute(
        "SELECT indexname, indexdef FROM pg_indexes WHERE tablename = %s AND indexname NOT LIKE %s",
        [table, "%_pkey"],
    )
    indexes = cursor.fetchall()
    cursor.execute(
        "SELECT conname FROM pg_constraint WHERE conrelid = %s::regclass AND contype = 'u'",
        [table],
    )
    constraints = [name for (name,) in cursor.fetchall()]
    for name in constraints:
        cursor.execute(f"ALTER TABLE {table} DROP CONSTRAINT {name}")
    for name, _ in indexes:
        cursor.execute(f"DROP INDEX IF EXISTS {name}")
    yield
    for _, definition in indexes:
        cursor.execute(definition)
    for name in constraints:
        cursor.execute(f"ALTER TABLE {table} ADD CONSTRAINT {name} UNIQUE USING INDEX {name}")


ROLLUP_COLUMNS = (
    "period",
    "scope",
    "key_id",
    "flavor",
    "start",
    "tenant_id",
    "project_id",
    "samples",
    "utilization_mean",
    "utilization_max",
    "utilization_p95",
    "memory_used_mean_mib",
    "power_mean_w",
    "gpu_seconds",
    "idle_gpu_seconds",
)


def rollup_rows(
    world: dict[str, Any], jobs: list[Planned], job_ids: list[int], until: datetime, interval: float
) -> Iterator[tuple[Any, ...]]:
    """The roll-up rows of [since, until) as rollup_run would write them, window by window:
    per device, job, tenant (per flavor) and flavor, at 5 minutes and hourly."""
    since, lanes = world["since"], world["lanes"]
    running: dict[int, tuple[int, Planned]] = {}
    ordered = sorted(zip(job_ids, jobs, strict=True), key=lambda pair: pair[1].start)
    position = 0
    for period, size in (("5m", FIVE), ("1h", HOUR)):
        per = size.total_seconds() / interval  # samples of one device in a window
        running.clear()
        position, start = 0, since
        while start < until:
            end = start + size
            while position < len(ordered) and ordered[position][1].start < end:
                job_id, job = ordered[position]
                running[job.lane] = (job_id, job)
                position += 1
            tenants: dict[tuple[int, str], list[float]] = defaultdict(lambda: [0.0, 0.0, 0.0, 0.0])
            flavors: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0, 0.0, 0.0, 0.0])
            for lane, (devices, flavor) in enumerate(lanes):
                holder = running.get(lane)
                if holder is not None and holder[1].end <= start:
                    holder = None
                util = holder[1].util if holder else 0.0
                held = size.total_seconds() if holder else 0.0
                idle = held if util < 5 else 0.0
                memory = 60000.0 if holder else 0.0
                for device in devices:
                    yield (
                        period,
                        "device",
                        device,
                        flavor,
                        start,
                        None,
                        None,
                        int(per),
                        util,
                        util,
                        util,
                        memory,
                        300.0 + util * 3,
                        held,
                        idle,
                    )
                agg = flavors[flavor]
                agg[0] += per * len(devices)
                agg[1] += util * per * len(devices)
                agg[2] += held * len(devices)
                agg[3] += idle * len(devices)
                agg[4] = max(agg[4], util)
                if holder:
                    job_id, job = holder
                    tenant, project = world["teams"][job.team]
                    yield (
                        period,
                        "job",
                        job_id,
                        flavor,
                        start,
                        tenant,
                        project,
                        int(per * LANE),
                        util,
                        util,
                        util,
                        memory,
                        300.0 + util * 3,
                        held * LANE,
                        idle * LANE,
                    )
                    t = tenants[(tenant, flavor)]
                    t[0] += per * LANE
                    t[1] += util * per * LANE
                    t[2] += held * LANE
                    t[3] += idle * LANE
            for (tenant, flavor), (n, total, held, idle) in tenants.items():
                yield (
                    period,
                    "tenant",
                    tenant,
                    flavor,
                    start,
                    None,
                    None,
                    int(n),
                    total / n,
                    total / n,
                    total / n,
                    60000.0,
                    500.0,
                    held,
                    idle,
                )
            for flavor, (n, total, held, idle, peak) in flavors.items():
                yield (
                    period,
                    "flavor",
                    0,
                    flavor,
                    start,
                    None,
                    None,
                    int(n),
                    total / n,
                    peak,
                    peak,
                    30000.0,
                    400.0,
                    held,
                    idle,
                )
            start = end


def build(
    gpus: int, days: int, raw_hours: int, interval: float, seed: int, now: datetime
) -> dict[str, Any]:
    """The cluster, the teams, the jobs and the history before the raw hours."""
    from django.conf import settings

    from scheduler.models import (
        Allocation,
        AllocationDevice,
        GpuDevice,
        Job,
        JobEvent,
        JobIdle,
        Node,
        QueueSnapshot,
        RollupWatermark,
    )
    from tenants.models import PriorityClass

    settings.GANTRY_UTILIZATION_SAMPLE_S = interval
    half = gpus * 500  # each flavor's GPUs, milli
    teams: list[tuple[str, str | None, dict[str, Any]]] = [
        ("acme", None, {f: (half, half, None) for f in FLAVORS})
    ]
    share = gpus * 1000 // 8
    for department, members in DEPARTMENTS.items():
        teams.append((department, "acme", {f: (share * 2, gpus * 500, None) for f in FLAVORS}))
        teams += [(t, department, {f: (share // 4, share, None) for f in FLAVORS}) for t in members]
    org = organisation(teams)
    klass = PriorityClass.objects.create(name="bench", value=100)
    nodes = Node.objects.bulk_create(
        Node(name=f"n-{i:04d}", flavor=FLAVORS[i % 2]) for i in range(gpus // 8)
    )
    devices = GpuDevice.objects.bulk_create(
        GpuDevice(node=node, index=index, model=node.flavor, memory_mib=81920)
        for node in nodes
        for index in range(8)
    )
    by_node: dict[int, list[Any]] = defaultdict(list)
    for device in devices:
        by_node[device.node_id].append(device)
    lanes = [
        ([d.pk for d in by_node[node.pk][i : i + LANE]], node.flavor, node)
        for node in nodes
        for i in range(0, 8, LANE)
    ]
    raw_start = now - timedelta(hours=raw_hours)
    since = now - timedelta(days=days)
    # Jobs one after another until the raw hours; each lane's last one runs on through them
    # (the raw samples are attributed to it through its live allocation).
    jobs = plan(len(lanes), since, raw_start, seed)
    last = {j.lane: j for j in jobs}
    jobs = [
        replace(j, end=now + timedelta(days=1), failed="") if last[j.lane] is j else j for j in jobs
    ]
    rows = Job.objects.bulk_create(
        (
            Job(
                project=org[j.team][2],
                tenant=org[j.team][0],
                submitted_by=org[j.team][1],
                name=f"{j.team}-{n}",
                job_type="training" if j.util > 5 else "interactive",
                state="running" if j.end > now else ("failed" if j.failed else "succeeded"),
                priority_class=klass,
                spec={},
                gpus_per_replica=LANE,
                gpu_milli_per_replica=LANE * 1000,
                started_at=j.start,
                finished_at=None if j.end > now else j.end,
            )
            for n, j in enumerate(jobs)
        ),
        batch_size=2000,
    )
    job_ids = [r.pk for r in rows]
    events = [
        JobEvent(job_id=pk, kind="attempt_failed", to_state="failed", data={"reason": j.failed})
        for pk, j in zip(job_ids, jobs, strict=True)
        if j.failed
    ]
    JobEvent.objects.bulk_create(events, batch_size=2000)
    failed_at = {pk: j.end for pk, j in zip(job_ids, jobs, strict=True) if j.failed}
    for pk, at in failed_at.items():  # `at` is set on insert: moved to the failure's time
        JobEvent.objects.filter(job_id=pk).update(at=at)
    JobIdle.objects.bulk_create(
        JobIdle(
            job_id=pk,
            tenant_id=org[j.team][0].pk,
            idle_seconds_total=(min(j.end, now) - j.start).total_seconds(),
        )
        for pk, j in zip(job_ids, jobs, strict=True)
        if j.util < 5
    )
    # The running jobs hold their lanes: the raw samples are attributed to them.
    holding = [(pk, j) for pk, j in zip(job_ids, jobs, strict=True) if j.end > now]
    allocations = Allocation.objects.bulk_create(
        Allocation(
            job_id=pk,
            node=lanes[j.lane][2],
            attempt=0,
            replica=0,
            pod_name=f"pod-{pk}",
            namespace=j.team,
            flavor=lanes[j.lane][1],
            gpu_milli=LANE * 1000,
            started_at=j.start,
        )
        for pk, j in holding
    )
    AllocationDevice.objects.bulk_create(
        AllocationDevice(allocation=allocation, device_id=device, milli=1000)
        for allocation, (_, j) in zip(allocations, holding, strict=True)
        for device in lanes[j.lane][0]
    )
    world = {
        "since": since,
        "lanes": [(ids, flavor) for ids, flavor, _ in lanes],
        "teams": {slug: (t.pk, p.pk) for slug, (t, _, p) in org.items()},
    }
    written = _copy(
        "scheduler_utilizationrollup",
        ROLLUP_COLUMNS,
        rollup_rows(world, jobs, job_ids, raw_start, interval),
    )
    snapshots = _snapshots(
        since,
        now,
        [t.pk for slug, (t, _, _) in org.items() if slug not in ("acme", *DEPARTMENTS)],
        seed,
    )
    QueueSnapshot.objects.bulk_create(snapshots, batch_size=5000)
    for name in ("5m", "1h"):
        RollupWatermark.objects.create(name=name, done_until=raw_start)
    return {
        "org": org,
        "nodes": [[d.pk for d in by_node[n.pk]] for n in nodes],
        "flavors": {d.pk: d.model for d in devices},
        "util": {device: j.util for _, j in holding for device in lanes[j.lane][0]},
        "raw_start": raw_start,
        "jobs": len(jobs),
        "rollups_written": written,
        "snapshots": len(snapshots),
        "long_job": max(
            zip(job_ids, jobs, strict=True), key=lambda p: min(p[1].end, now) - p[1].start
        )[0],
    }


def _snapshots(since: datetime, until: datetime, tenants: list[int], seed: int) -> list[Any]:
    """The queue's 5-minute snapshots: a daily tide of waiting jobs and their admissions."""
    from scheduler.models import QueueSnapshot

    rng = np.random.default_rng(seed)
    out = []
    at = since
    while at < until:
        tide = 1 + np.sin((at.hour - 8) / 24 * 2 * np.pi)
        cluster = QueueSnapshot(at=at, tenant_id=None, wait_buckets=[0] * 15, flavors={})
        for tenant in tenants:
            queued = int(rng.poisson(3 * tide))
            admitted = int(rng.poisson(0.5))
            buckets = [0] * 15
            for _ in range(admitted):
                buckets[int(rng.integers(4, 13))] += 1
            wait = float(sum(2.0 ** (i - 1) * n for i, n in enumerate(buckets)))
            out.append(
                QueueSnapshot(
                    at=at,
                    tenant_id=tenant,
                    queued_jobs=queued,
                    queued_gpus=queued * 4.0,
                    admissions=admitted,
                    wait_sum_s=wait,
                    wait_buckets=buckets,
                )
            )
            cluster.queued_jobs += queued
            cluster.queued_gpus += queued * 4.0
            cluster.admissions += admitted
            cluster.wait_sum_s += wait
            cluster.wait_buckets = [
                a + b for a, b in zip(cluster.wait_buckets, buckets, strict=True)
            ]
        cluster.flavors = {
            f: [float(rng.integers(0, 40)), float(rng.integers(0, 8))] for f in FLAVORS
        }
        out.append(cluster)
        at += FIVE
    return out


def ingest(built: dict[str, Any], now: datetime, interval: float) -> tuple[int, float]:
    """The raw hours through `samples_ingest`, one call per node per round. Returns the
    samples written and the seconds spent in the calls."""
    from scheduler.telemetry.samples import DeviceReading, samples_ingest

    samples, elapsed = 0, 0.0
    at, util, flavors = built["raw_start"], built["util"], built["flavors"]
    while at < now:
        prepared = [
            [
                DeviceReading(d, util.get(d, 0.0), 60000 if d in util else 0, 350.0, 60.0, None)
                for d in ids
            ]
            for ids in built["nodes"]
        ]
        began = time.perf_counter()
        for batch in prepared:
            samples += samples_ingest(
                batch, at=at, flavors={r.device_id: flavors[r.device_id] for r in batch}
            )
        elapsed += time.perf_counter() - began
        at += timedelta(seconds=interval)
    return samples, elapsed


def roll_up(now: datetime) -> float:
    from scheduler.telemetry.rollups import LAG, rollup_run

    began = time.perf_counter()
    while rollup_run(now=now + LAG):
        pass
    return time.perf_counter() - began


def p95_ms(call: Any, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        began = time.perf_counter()
        call()
        times.append((time.perf_counter() - began) * 1000)
    return round(float(np.percentile(times, 95)), 1)


def timings(built: dict[str, Any], now: datetime, repeat: int) -> dict[str, dict[str, float]]:
    """p95 ms per dashboard and range: the selectors the views call, as a view calls them
    (the job's page reads its whole life)."""
    from scheduler.models import Job
    from scheduler.telemetry.dashboards import (
        RANGES,
        cluster_dashboard,
        tenant_dashboard,
        window_for,
    )
    from scheduler.telemetry.job_dashboard import job_utilization

    department = built["org"]["research"][0]
    job = Job.objects.get(pk=built["long_job"])
    out: dict[str, dict[str, float]] = {"cluster": {}, "tenant": {}, "job": {}}
    for key in RANGES:
        window = window_for(key, now)
        out["cluster"][key] = p95_ms(lambda w=window: cluster_dashboard(w), repeat)
        out["tenant"][key] = p95_ms(lambda w=window: tenant_dashboard(department, w), repeat)
    out["job"]["life"] = p95_ms(lambda: job_utilization(job, now), repeat)
    return out


def run_here(
    gpus: int, days: int, raw_hours: int, interval: float, repeat: int, seed: int = 1
) -> dict[str, Any]:
    """Build, ingest, roll up and time in the database Django is connected to."""
    from django.db import connection
    from django.utils import timezone

    from scheduler.telemetry.rollups import floor_to

    now = floor_to(timezone.now(), HOUR)
    began = time.perf_counter()
    built = build(gpus, days, raw_hours, interval, seed, now)
    build_s = time.perf_counter() - began
    samples, ingest_s = ingest(built, now, interval)
    rollup_s = roll_up(now)
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute("ANALYZE")
    by_range = timings(built, now, repeat)
    return {
        "gpus": gpus,
        "days": days,
        "jobs": built["jobs"],
        "ingested": {
            "raw_hours": raw_hours,
            "interval_s": interval,
            "samples": samples,
            "note": "raw samples of the last raw_hours through samples_ingest, rolled up by "
            "rollup_run; the days before written directly as roll-up rows (5-minute and "
            "hourly, every device, job, tenant and flavor)",
        },
        "ingest_samples_per_s": round(samples / ingest_s, 1) if ingest_s else None,
        "rollup_s": round(rollup_s, 1),
        "rollups_written_directly": built["rollups_written"],
        "queue_snapshots": built["snapshots"],
        "build_s": round(build_s, 1),
        "repeat": repeat,
        "p95_ms": {name: max(ranges.values()) for name, ranges in by_range.items()},
        "p95_ms_by_range": by_range,
        "target_p95_ms": 300,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", default=DEFAULT_URL)
    parser.add_argument("--gpus", type=int, default=1000, help="GPUs, on nodes of 8")
    parser.add_argument("--days", type=int, default=30, help="days of history")
    parser.add_argument("--raw-hours", type=int, default=2, help="hours ingested as raw samples")
    parser.add_argument("--interval-s", type=float, default=30.0, help="seconds between samples")
    parser.add_argument("--repeat", type=int, default=20, help="timed requests per range")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    fresh_database(args.url)
    result = run_here(args.gpus, args.days, args.raw_hours, args.interval_s, args.repeat, args.seed)
    text = json.dumps(result, indent=2)
    print(text)
    if args.json:
        args.json.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
