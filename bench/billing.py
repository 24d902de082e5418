"""Billing at the scale of a month: meter it, close it, export it.

    python -m bench.billing --gpus 512 --days 30 --jobs 50000 --json out.json

Builds a realistic month in a fresh PostgreSQL database (`--url`, default DATABASE_URL or
postgres://postgres@127.0.0.1:5432/bench_billing; it is dropped and created): two
organisations of departments, teams, projects and users; H100, A100 and L4 nodes of 8 GPUs
with different prices; guarantees on teams and departments; whole-GPU, multi-GPU, two-replica
and fractional (250 and 500 milli) jobs; preempted, failed-and-retried and failed attempts
with the job events billing reads to classify them (billing/metering/attempts.py); a rate change in
the middle of the period, on the hour; nodes cordoned and a device unhealthy for part of it.
The rows are written with bulk inserts, not through the scheduler, and depend only on
`--seed`. The period starts 2031-04-01 (a 30-day month: `--days 30` is the month of April).

Then it times, in this process:
- `meter_s`: billing.metering.hourly.meter_usage over every hour of the period (in three runs: the
  nodes are cordoned between the first and the second, since metering reads the inventory
  as it is when it meters an hour);
- `close_s`: billing.statements.closing.statement_close of the period for every organisation;
- `export_s`: one XLSX export of the period through billing.exports.formats.export_write, as a
  finance user (null when billing/exports/formats.py is not there).
and reports `lines` (statement lines), `reconciled` (both identities to the cent:
billing/statements/reconciliation.py), the peak RSS of the measuring process and how much it grew
while measuring. The build runs in a child process, so that its memory is not the measurement's.

PostgreSQL only: the benchmark drops and creates its database. The build and the measures
themselves use the ORM only; tests/billing/test_bench_billing.py runs them on the test
database (either engine) at a tiny scale.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import random
import resource
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any

DEFAULT_URL = "postgres://postgres@127.0.0.1:5432/bench_billing"
START = datetime(2031, 4, 1, tzinfo=UTC)
# name, share of the nodes, GPU-hour before and after the rate change, CPU core-hour, GiB-hour
FLAVORS = (
    ("H100-80GB", 4, "4.100000", "3.850000", "0.040000", "0.005000"),
    ("A100-80GB", 3, "2.600000", "2.750000", "0.035000", "0.004000"),
    ("L4-24GB", 1, "0.800000", "0.720000", "0.020000", "0.002000"),
)
MULTIPLIERS = {"critical": "1.5000", "high": "1.2000", "low": "0.8000", "best-effort": "0.5000"}
# organisation -> department -> teams
TREE = {
    "acme": {"research": ["vision", "language", "speech"], "product": ["search", "ads"]},
    "globex": {"labs": ["robotics", "biology"]},
}
JOB_TYPES = (
    ("training", 30),
    ("fine-tuning", 15),
    ("inference", 20),
    ("evaluation", 10),
    ("batch", 20),
    ("interactive", 5),
)
CLASS_OF = {
    "inference": "high",
    "training": "normal",
    "fine-tuning": "normal",
    "interactive": "normal",
    "batch": "low",
    "evaluation": "low",
}


@dataclass
class Lane:
    """Devices that run one job at a time for the whole period: per replica, a node and its
    (device index, milli) shares."""

    flavor: str
    replicas: list[tuple[int, list[tuple[int, int]]]]
    jobs: int = 0


@dataclass
class Month:
    """The period's shape, derived from the parameters alone."""

    gpus: int
    days: int
    jobs: int
    seed: int
    nodes: list[str] = field(default_factory=list)  # flavor of each node
    lanes: list[Lane] = field(default_factory=list)

    @property
    def start(self) -> datetime:
        return START

    @property
    def end(self) -> datetime:
        return START + timedelta(days=self.days)

    @property
    def rate_change(self) -> datetime:
        """The middle of the period, on the hour."""
        return START + timedelta(hours=self.days * 12)

    @property
    def cordon(self) -> tuple[datetime, datetime]:
        """Some nodes are cordoned over the second sixth of the period (on the hour)."""
        hours = self.days * 24
        return START + timedelta(hours=hours // 3), START + timedelta(hours=hours // 2)

    def cordoned_nodes(self) -> list[int]:
        """One node of each flavor (its last), when the flavor has more than one."""
        out = []
        for flavor, *_ in FLAVORS:
            own = [i for i, f in enumerate(self.nodes) if f == flavor]
            if len(own) > 1:
                out.append(own[-1])
        return out


def shape(gpus: int, days: int, jobs: int, seed: int) -> Month:
    month = Month(gpus, days, jobs, seed)
    count = max(1, gpus // 8)
    weights = sum(f[1] for f in FLAVORS)
    per = [count * f[1] // weights for f in FLAVORS]
    per[0] += count - sum(per)
    if count >= len(FLAVORS):  # every flavor at least once
        for i in range(1, len(per)):
            while per[i] == 0:
                per[0] -= 1
                per[i] += 1
    for (flavor, *_), n in zip(FLAVORS, per, strict=True):
        month.nodes += [flavor] * n
    for flavor, *_ in FLAVORS:
        own = [i for i, f in enumerate(month.nodes) if f == flavor]
        for position, node in enumerate(own):
            month.lanes += _lanes(flavor, node, position)
    # Two-replica jobs: the first two nodes of the flavor with a whole-node layout run gangs.
    for flavor, *_ in FLAVORS:
        whole = [
            lane for lane in month.lanes if lane.flavor == flavor and len(lane.replicas[0][1]) == 8
        ]
        if len(whole) >= 2:
            first, second = whole[:2]
            first.replicas.append(second.replicas[0])
            month.lanes.remove(second)
    # Spread the jobs over the lanes: equal numbers, the rest to the first lanes.
    for index, lane in enumerate(month.lanes):
        lane.jobs = jobs // len(month.lanes) + (1 if index < jobs % len(month.lanes) else 0)
    return month


def _lanes(flavor: str, node: int, position: int) -> list[Lane]:
    def lane(*devices: tuple[int, int]) -> Lane:
        return Lane(flavor, [(node, list(devices))])

    whole = 1000
    layout = position % 4
    if layout == 0:  # one job of 8 GPUs at a time
        return [lane(*[(d, whole) for d in range(8)])]
    if layout == 1:  # two of 4
        return [lane(*[(d, whole) for d in range(4)]), lane(*[(d, whole) for d in range(4, 8)])]
    if layout == 2:  # two of 2, four of 1
        return [lane((0, whole), (1, whole)), lane((2, whole), (3, whole))] + [
            lane((d, whole)) for d in range(4, 8)
        ]
    # Fractional: device 0 in quarters, device 1 in halves, devices 2-3 a half and two
    # quarters, devices 4-7 whole.
    return (
        [lane((0, 250)) for _ in range(4)]
        + [lane((1, 500)) for _ in range(2)]
        + [lane((d, m)) for d in (2, 3) for m in (500, 250, 250)]
        + [lane((d, whole)) for d in range(4, 8)]
    )


# --- the build (in a child process) --------------------------------------------------------


def build(month: Month) -> dict[str, Any]:
    """Write the month's rows; returns counts. Needs Django set up on an empty database."""
    from django.contrib.auth import get_user_model

    from billing.models import RateCard, RateMultiplier
    from scheduler.models import GpuDevice, JobEvent, Node
    from tenants.models import (
        PlatformRole,
        PlatformRoleName,
        PriorityClass,
        Project,
        Quota,
        ResourceFlavor,
        Tenant,
        TenantKind,
    )

    rng = random.Random(month.seed)
    user_model = get_user_model()
    classes = {pc.name: pc for pc in PriorityClass.objects.all()}
    flavors = {
        name: ResourceFlavor.objects.get_or_create(name=name, defaults={"memory_mib": 81920})[0]
        for name, *_ in FLAVORS
    }
    # Rates: one version to the middle of the period, the next from there on.
    for name, _, before, after, cpu, mem in FLAVORS:
        for valid_from, valid_to, gpu_hour in (
            (month.start, month.rate_change, before),
            (month.rate_change, None, after),
        ):
            card = RateCard.objects.create(
                flavor=flavors[name],
                valid_from=valid_from,
                valid_to=valid_to,
                gpu_hour=Decimal(gpu_hour),
                cpu_core_hour=Decimal(cpu),
                memory_gib_hour=Decimal(mem),
                borrowed_discount=Decimal("0.3000"),
            )
            RateMultiplier.objects.bulk_create(
                RateMultiplier(rate_card=card, priority_class=classes[pc], multiplier=Decimal(m))
                for pc, m in MULTIPLIERS.items()
            )
    # The tenant tree: guarantees on teams (a share of each flavor), departments hold their
    # teams' and a little more.
    capacity = {name: month.nodes.count(name) * 8000 for name, *_ in FLAVORS}
    teams: list[tuple[Tenant, list[Any], list[Project]]] = []
    team_count = sum(len(t) for departments in TREE.values() for t in departments.values())

    def tenant(slug: str, kind: str, parent: Tenant | None) -> Tenant:
        row = Tenant.objects.create(slug=slug, name=slug, kind=kind, parent=parent)
        row.path = f"{parent.path if parent else '/'}{row.pk}/"
        row.depth = parent.depth + 1 if parent else 0
        row.save(update_fields=["path", "depth"])
        return row

    # Guarantees: each team a share of every flavor; a department its teams' and 5 % more;
    # an organisation its departments' (a parent's guarantee holds its children's, and the
    # database checks it on insert: parents first).
    share = {name: milli * 6 // 10 // team_count // 250 * 250 for name, milli in capacity.items()}
    extra = {name: milli // 20 // 250 * 250 for name, milli in capacity.items()}
    levels: list[list[Any]] = [[], [], []]

    def guarantee(level: int, holder: Tenant, held: dict[str, int]) -> None:
        levels[level] += [
            Quota(
                tenant=holder,
                flavor=flavors[name],
                guaranteed_milli=milli,
                limit_milli=capacity[name],
            )
            for name, milli in held.items()
            if milli
        ]

    for org_slug, departments in TREE.items():
        org = tenant(org_slug, TenantKind.ORGANISATION, None)
        guarantee(
            0,
            org,
            {n: sum(share[n] * len(t) + extra[n] for t in departments.values()) for n in share},
        )
        for dept_slug, team_slugs in departments.items():
            dept = tenant(dept_slug, TenantKind.DEPARTMENT, org)
            guarantee(1, dept, {n: share[n] * len(team_slugs) + extra[n] for n in share})
            for team_slug in team_slugs:
                team = tenant(team_slug, TenantKind.TEAM, dept)
                guarantee(2, team, share)
                users = [user_model.objects.create(username=f"{team_slug}-{i}") for i in range(3)]
                projects = [
                    Project.objects.create(
                        tenant=team,
                        slug=f"{team_slug}-p{i}",
                        name=f"{team_slug} {i}",
                        namespace=f"{team_slug}-p{i}",
                    )
                    for i in range(2)
                ]
                teams.append((team, users, projects))
    for level in levels:
        Quota.objects.bulk_create(level)
    finance = user_model.objects.create(username="finance")
    PlatformRole.objects.create(user=finance, role=PlatformRoleName.FINANCE)
    # Nodes and devices; one device of the first node turns unhealthy with the cordon.
    nodes = Node.objects.bulk_create(
        Node(name=f"node-{i:04d}", flavor=f, cpu_milli=128000, memory_mib=1 << 20)
        for i, f in enumerate(month.nodes)
    )
    devices = GpuDevice.objects.bulk_create(
        GpuDevice(node=node, index=d, model=node.flavor, memory_mib=81920)
        for node in nodes
        for d in range(8)
    )
    device_ids = {(d.node_id, d.index): d.pk for d in devices}
    written = {"jobs": 0, "allocations": 0, "shares": 0, "events": 0}
    # Events carry the instants of the month, not the wall clock `auto_now_add` would stamp.
    stamp = JobEvent._meta.get_field("at")
    stamp.auto_now_add = False  # type: ignore[attr-defined]
    try:
        for chunk in _chunks(_lane_jobs(month, rng, teams, classes), 2000):
            _write(chunk, nodes, device_ids, written)
    finally:
        stamp.auto_now_add = True  # type: ignore[attr-defined]
    return {"nodes": len(nodes), "devices": len(devices), "lanes": len(month.lanes), **written}


@dataclass
class Attempt:
    start: datetime
    end: datetime | None
    ending: str | None  # the state the attempt ended in (None: still running)


@dataclass
class PlannedJob:
    lane: Lane
    team: tuple[Any, list[Any], list[Any]]
    user: Any
    project: Any
    job_type: str
    priority: Any
    attempts: list[Attempt]
    state: str
    cpu_milli: int
    memory_mib: int


def _lane_jobs(
    month: Month, rng: random.Random, teams: list[Any], classes: dict[str, Any]
) -> Iterator[PlannedJob]:
    """Each lane's jobs back to back with idle gaps, filling about three quarters of it."""
    span = (month.end - month.start).total_seconds()
    cordoned = set(month.cordoned_nodes())
    cordon_from, cordon_to = month.cordon
    kinds = [k for k, _ in JOB_TYPES]
    kind_weights = [w for _, w in JOB_TYPES]
    for lane in month.lanes:
        if not lane.jobs:
            continue
        slot = span / lane.jobs
        drained = any(node in cordoned for node, _ in lane.replicas)
        moment = month.start + timedelta(seconds=rng.uniform(0, slot / 2))
        for index in range(lane.jobs):
            duration = timedelta(seconds=rng.uniform(0.4, 1.1) * slot)
            if drained and moment < cordon_to and moment + duration > cordon_from:
                moment = cordon_to + timedelta(seconds=rng.uniform(0, 600))
            team = rng.choice(teams)
            job_type = rng.choices(kinds, kind_weights)[0]
            roll = rng.random()
            priority = (
                "best-effort" if roll < 0.08 else "critical" if roll < 0.12 else CLASS_OF[job_type]
            )
            attempts: list[Attempt] = []
            fate = rng.random()
            if fate < 0.07:  # preempted, then run again to the end
                cut = duration * rng.uniform(0.1, 0.6)
                attempts.append(Attempt(moment, moment + cut, "preempted"))
                moment += cut + timedelta(seconds=rng.uniform(30, 900))
                duration -= cut
            elif fate < 0.11:  # failed, retried
                cut = duration * rng.uniform(0.05, 0.3)
                attempts.append(Attempt(moment, moment + cut, "queued"))
                moment += cut + timedelta(seconds=rng.uniform(30, 300))
                duration -= cut
            last = index == lane.jobs - 1
            final = "failed" if fate > 0.98 else "succeeded"
            if last and rng.random() < 0.3:  # still running when the period is metered
                attempts.append(Attempt(moment, None, None))
                state = "running"
            else:
                attempts.append(Attempt(moment, moment + duration, final))
                state = final
            moment += duration + timedelta(seconds=rng.uniform(0, 0.5) * slot)
            users, projects = team[1], team[2]
            yield PlannedJob(
                lane,
                team,
                rng.choice(users),
                rng.choice(projects),
                job_type,
                classes[priority],
                attempts,
                state,
                rng.choice((2000, 4000, 8000, 16000)),
                rng.choice((8192, 16384, 65536)),
            )


def _chunks(items: Iterator[PlannedJob], size: int) -> Iterator[list[PlannedJob]]:
    chunk: list[PlannedJob] = []
    for item in items:
        chunk.append(item)
        if len(chunk) == size:
            yield chunk
            chunk = []
    if chunk:
        yield chunk


def _write(
    chunk: list[PlannedJob], nodes: list[Any], device_ids: dict[Any, int], written: dict
) -> None:
    from scheduler.models import Allocation, AllocationDevice, Job, JobEvent

    jobs = []
    for n, planned in enumerate(chunk):
        shares = planned.lane.replicas[0][1]
        milli = sum(m for _, m in shares)
        whole = milli // 1000 if milli >= 1000 else 0
        jobs.append(
            Job(
                project=planned.project,
                tenant=planned.team[0],
                submitted_by=planned.user,
                name=f"job-{written['jobs'] + n}",
                job_type=planned.job_type,
                state=planned.state,
                priority_class=planned.priority,
                spec={"name": f"job-{written['jobs'] + n}", "type": planned.job_type},
                replicas=len(planned.lane.replicas),
                gpus_per_replica=whole,
                gpu_milli_per_replica=milli,
                cpu_milli=planned.cpu_milli,
                memory_mib=planned.memory_mib,
                flavors=[planned.lane.flavor],
                attempt=len(planned.attempts) - 1,
                queued_at=planned.attempts[0].start,
                started_at=planned.attempts[0].start,
                finished_at=planned.attempts[-1].end if planned.state != "running" else None,
            )
        )
    jobs = Job.objects.bulk_create(jobs)
    allocations: list[Allocation] = []
    devices: list[list[tuple[int, int]]] = []
    events: list[JobEvent] = []
    for job, planned in zip(jobs, chunk, strict=True):
        for attempt, run in enumerate(planned.attempts):
            for replica, (node, shares) in enumerate(planned.lane.replicas):
                allocations.append(
                    Allocation(
                        job=job,
                        node=nodes[node],
                        attempt=attempt,
                        replica=replica,
                        pod_name=f"gantry-{job.pk}-a{attempt}-r{replica}",
                        namespace=planned.project.namespace,
                        flavor=planned.lane.flavor,
                        gpu_milli=sum(m for _, m in shares),
                        started_at=run.start,
                        bound_at=run.start + timedelta(seconds=2),
                        ended_at=run.end,
                        end_reason="" if run.end is None else run.ending or "",
                    )
                )
                devices.append([(device_ids[(nodes[node].pk, d)], m) for d, m in shares])
            events.append(_event(job, run.start, "queued", "admitted"))
            events.append(_event(job, run.start + timedelta(seconds=3), "binding", "running"))
            if run.end is not None and run.ending:
                events.append(_event(job, run.end, "running", run.ending))
    allocations = Allocation.objects.bulk_create(allocations)
    rows = [
        AllocationDevice(
            allocation=allocation,
            device_id=device,
            milli=milli,
            released=allocation.ended_at is not None,
        )
        for allocation, held in zip(allocations, devices, strict=True)
        for device, milli in held
    ]
    AllocationDevice.objects.bulk_create(rows, batch_size=5000)
    JobEvent.objects.bulk_create(events, batch_size=5000)
    written["jobs"] += len(jobs)
    written["allocations"] += len(allocations)
    written["shares"] += len(rows)
    written["events"] += len(events)


def _event(job: Any, at: datetime, from_state: str, to_state: str) -> Any:
    from scheduler.models import JobEvent

    return JobEvent(job=job, kind="state", from_state=from_state, to_state=to_state, at=at)


# --- the measures --------------------------------------------------------------------------


def rss_mib() -> float:
    """The resident set of this process now, MiB (Linux /proc)."""
    pages = int(Path("/proc/self/statm").read_text().split()[1])
    return pages * os.sysconf("SC_PAGE_SIZE") / 2**20


def peak_rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def meter(month: Month) -> float:
    """Meter the period in three runs, cordoning nodes (and a device unhealthy) between the
    first and the second and bringing them back after; the seconds spent metering."""
    from django.conf import settings

    from billing.metering.hourly import meter_usage
    from scheduler.models import GpuDevice, Node

    delay = timedelta(seconds=settings.GANTRY_METERING_DELAY_S + 60)
    cordon_from, cordon_to = month.cordon
    names = [f"node-{i:04d}" for i in month.cordoned_nodes()]
    spent = 0.0
    for until, cordoned in ((cordon_from, False), (cordon_to, True), (month.end, False)):
        Node.objects.filter(name__in=names).update(cordoned=cordoned)
        GpuDevice.objects.filter(node__name="node-0000", index=7).update(healthy=not cordoned)
        began = time.perf_counter()
        while meter_usage(now=until + delay):
            pass
        spent += time.perf_counter() - began
    return spent


def close(month: Month) -> tuple[float, list[Any]]:
    from django.contrib.auth import get_user_model

    from billing.statements.closing import statement_close
    from tenants.models import Tenant

    finance = get_user_model().objects.get(username="finance")
    began = time.perf_counter()
    statements = [
        statement_close(
            user=finance,
            organisation=organisation,
            start=month.start,
            end=month.end,
            now=month.end + timedelta(days=1),
        )
        for organisation in Tenant.objects.filter(parent__isnull=True).order_by("pk")
    ]
    return time.perf_counter() - began, statements


def export(month: Month, out: Path) -> tuple[float | None, int | None]:
    """One XLSX export of the period by the finest aggregation, as finance; (None, None)
    while billing/exports/formats.py is not there."""
    try:
        from billing.exports.formats import export_write  # type: ignore[import-not-found,unused-ignore]
    except ImportError:
        return None, None
    from django.contrib.auth import get_user_model

    finance = get_user_model().objects.get(username="finance")
    query = {"from": month.start, "to": month.end, "by": "user"}
    began = time.perf_counter()
    with out.open("wb") as handle:
        rows = export_write(user=finance, fmt="xlsx", query=query, out=handle)
    return time.perf_counter() - began, rows


def reconciled(month: Month, statements: list[Any]) -> dict[str, bool]:
    """Both identities to the cent: every statement's lines add up to its root's total, and
    the cluster's four parts add up to its capacity cost, per flavor."""
    from billing.statements.reconciliation import cluster_reconciliation
    from billing.statements.rollup import roll_up

    leaves = True
    for statement in statements:
        lines = list(statement.lines.values_list("tenant_id", "amount", "charged"))
        totals = roll_up(lines)
        root = totals.get(statement.organisation_id)
        charged = sum((a for _, a, c in lines if c), Decimal("0.00"))
        showback = sum((a for _, a, c in lines if not c), Decimal("0.00"))
        leaves = (
            leaves and root is not None and (root.charged, root.showback) == (charged, showback)
        )
    cluster = cluster_reconciliation(month.start, month.end)
    capacity = bool(cluster) and all(row.reconciled for row in cluster)
    return {"leaves_to_root": leaves, "cluster_capacity": capacity}


def cpu_s() -> tuple[float, float]:
    """CPU seconds so far of this process and of its PostgreSQL backend: on a shared machine
    the wall time of a phase includes others' work, its CPU time does not."""
    from django.db import connection

    if connection.vendor != "postgresql":
        return time.process_time(), 0.0
    from bench.daemon_setup import postgres_cpu_s

    return time.process_time(), postgres_cpu_s()


def measure(month: Month, export_to: Path) -> dict[str, Any]:
    """Time metering, closing and the export of the month built by `build`."""
    from billing.models import StatementLine, UsageRecord

    gc.collect()
    before = rss_mib()
    cpu = [cpu_s()]
    meter_s = meter(month)
    cpu.append(cpu_s())
    close_s, statements = close(month)
    cpu.append(cpu_s())
    export_s, export_rows = export(month, export_to)
    cpu.append(cpu_s())
    peak = peak_rss_mib()
    spent = {
        f"{phase}_cpu_s": {
            "python": round(after[0] - began[0], 3),
            "postgresql": round(after[1] - began[1], 3),
        }
        for phase, began, after in zip(("meter", "close", "export"), cpu, cpu[1:], strict=False)
    }
    checks = reconciled(month, statements)
    return {
        "meter_s": round(meter_s, 3),
        "close_s": round(close_s, 3),
        "export_s": None if export_s is None else round(export_s, 3),
        "total_s": round(meter_s + close_s + (export_s or 0.0), 3),
        **spent,
        "lines": StatementLine.objects.filter(statement__in=statements).count(),
        "usage_records": UsageRecord.objects.count(),
        "export_rows": export_rows,
        "reconciled": all(checks.values()),
        "reconciliation": checks,
        "rss_before_mib": round(before, 1),
        "peak_rss_mib": round(peak, 1),
        "rss_growth_mib": round(peak - before, 1),
    }


def run_here(gpus: int, days: int, jobs: int, seed: int, export_to: Path) -> dict[str, Any]:
    """Build and measure on the database Django is set up on (the smoke test's): no fresh
    database, no child process."""
    month = shape(gpus, days, jobs, seed)
    built = build(month)
    return {"gpus": gpus, "days": days, "seed": seed, **built, **measure(month, export_to)}


# --- the command ---------------------------------------------------------------------------


def _setup(url: str, fresh: bool) -> None:
    from bench.daemon_setup import fresh_database

    if fresh:
        fresh_database(url)
        return
    os.environ["DATABASE_URL"] = url
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
    os.environ.setdefault("GANTRY_LOG_LEVEL", "WARNING")
    os.environ.setdefault("DJANGO_DEBUG", "0")
    import django

    django.setup()
    from django.core.management import call_command

    # A kept build may predate the code's latest migrations.
    call_command("migrate", verbosity=0)


def _built(args: argparse.Namespace, argv: list[str] | None) -> dict[str, Any]:
    """Build the month in a child process (its memory is not the measurement's). With
    `--keep-build`, the built database is kept as a template named after the parameters and
    copied on the next run with the same ones, instead of built again."""
    import psycopg
    import psycopg.sql

    base, name = args.url.rsplit("/", 1)
    template = f"{name}_built_{args.gpus}_{args.days}_{args.jobs}_{args.seed}"
    with psycopg.connect(f"{base}/postgres", autocommit=True) as conn:
        kept = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (template,)).fetchone()
        if args.keep_build and kept:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
            conn.execute(f'CREATE DATABASE "{name}" TEMPLATE "{template}"')
            comment = conn.execute(
                "SELECT shobj_description(oid, 'pg_database') FROM pg_database WHERE datname = %s",
                (template,),
            ).fetchone()
            return dict(json.loads(comment[0])) if comment and comment[0] else {}
    child = subprocess.run(  # noqa: S603 (this module, with the command line it was given)
        [sys.executable, "-m", "bench.billing", *(argv or sys.argv[1:]), "--phase", "build"],
        check=True,
        stdout=subprocess.PIPE,
        text=True,
    )
    built: dict[str, Any] = json.loads(child.stdout.strip().splitlines()[-1])
    if args.keep_build:
        with psycopg.connect(f"{base}/postgres", autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{template}" WITH (FORCE)')
            conn.execute(f'CREATE DATABASE "{template}" TEMPLATE "{name}"')
            conn.execute(
                f'COMMENT ON DATABASE "{template}" IS ' + psycopg.sql.quote(json.dumps(built))  # type: ignore[attr-defined]
            )
    return built


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--gpus", type=int, default=512, help="GPUs, on nodes of 8")
    parser.add_argument("--days", type=int, default=30, help="length of the period, days")
    parser.add_argument("--jobs", type=int, default=50000, help="jobs in the period")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--url", default=os.environ.get("DATABASE_URL") or DEFAULT_URL)
    parser.add_argument("--json", type=Path, help="write the result here too")
    parser.add_argument(
        "--keep-build",
        action="store_true",
        help="keep the built month as a template database and reuse it on the next run with "
        "the same parameters (to compare code changes on the same data)",
    )
    parser.add_argument("--cprofile", type=Path, help="profile the measures into this file")
    parser.add_argument(
        "--phase", choices=("all", "build", "measure"), default="all", help=argparse.SUPPRESS
    )
    args = parser.parse_args(argv)
    if not args.url.startswith(("postgres://", "postgresql://")):
        parser.error(
            f"--url {args.url!r}: the benchmark runs on PostgreSQL only (it drops and creates "
            "its database); give a postgres:// URL, e.g. " + DEFAULT_URL
        )
    if args.gpus < 8 or args.days < 1 or args.jobs < 1:
        parser.error("--gpus 8 or more (nodes of 8), --days and --jobs 1 or more")
    month = shape(args.gpus, args.days, args.jobs, args.seed)
    params = {"gpus": args.gpus, "days": args.days, "jobs": args.jobs, "seed": args.seed}
    if args.phase == "build":
        _setup(args.url, fresh=True)
        began = time.perf_counter()
        counts = build(month)
        counts["build_s"] = round(time.perf_counter() - began, 3)
        print(json.dumps(counts))
        return 0
    built = _built(args, argv) if args.phase == "all" else {}
    _setup(args.url, fresh=False)
    profiler = None
    if args.cprofile:
        import cProfile

        profiler = cProfile.Profile()
        profiler.enable()
    with tempfile.TemporaryDirectory() as scratch:
        result = {**params, **built, **measure(month, Path(scratch) / "month.xlsx")}
    if profiler is not None:
        profiler.disable()
        profiler.dump_stats(args.cprofile)
    print(json.dumps(result, indent=2))
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
