"""Cost of a /metrics scrape with a long job history, before and after the running totals.

    python -m bench.metrics_scrape --json out.json [--jobs 100000] [--scrapes 10]

A fresh PostgreSQL database with `--jobs` finished jobs of 10 tenants and 3 priority classes,
each with its lifecycle's events (queued, admitted, binding, running, then succeeded; some
of them preempted once and requeued, or drained, before finishing): about 5.1 events a job,
written an hour and more before the scrapes. Then `--scrapes` scrapes of the whole collector,
each after 50 new events (new jobs queued and admitted), timed two ways:

- before: the counters and the wait histogram counted over the whole history at each scrape
  (`scheduler.metrics.recount.recount`, what /metrics did before the totals);
- after: the running totals (`scheduler.metrics.tally.job_event_tallies`), after a first
  scrape has settled the history into them (that one costs about a recount, once).

Reports the median milliseconds of each whole scrape and of its counters' part, and the
ratios before / after.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from bench.daemon_setup import fresh_database, organisation

DEFAULT_URL = "postgres://postgres@127.0.0.1:5432/gantry_bench_metrics"
FLAVOR = "H100-80GB"
BATCH = 5000
# Jobs preempted once before they finish: 5 events a job, 9 for these (5.1 a job on average).
PREEMPTED = 0.025


def history(jobs: int, start: datetime) -> int:
    """`jobs` finished jobs and their events, in time order. Returns the events written."""
    from scheduler.models import Job, JobEvent
    from tenants.models import PriorityClass

    teams = organisation([(f"team-{i}", None, {FLAVOR: (8000, 16000, None)}) for i in range(10)])
    classes = [
        PriorityClass.objects.update_or_create(
            name=name, defaults={"value": value, "counts_against_quota": counts}
        )[0]
        for name, value, counts in [
            ("bench-normal", 1100, True),
            ("bench-high", 1200, True),
            ("bench-spot", 1001, False),
        ]
    ]
    rng = random.Random(20)
    written = 0
    stamped = JobEvent._meta.get_field("at")
    stamped.auto_now_add = False  # type: ignore[attr-defined]  # the history's own times
    for first in range(0, jobs, BATCH):
        made = Job.objects.bulk_create(
            _job(rng, list(teams.values()), classes, n)
            for n in range(first, min(jobs, first + BATCH))
        )
        events = [e for job in made for e in _lifecycle(rng, job, made, start)]
        events.sort(key=lambda e: e.at)
        JobEvent.objects.bulk_create(events, batch_size=BATCH)
        written += len(events)
    stamped.auto_now_add = True  # type: ignore[attr-defined]
    return written


def _job(rng: random.Random, teams: list[Any], classes: list[Any], n: int) -> Any:
    from scheduler.models import Job

    tenant, user, project = rng.choice(teams)
    return Job(
        project=project,
        tenant=tenant,
        submitted_by=user,
        name=f"job-{n}",
        job_type="training",
        state="succeeded",
        priority_class=rng.choice(classes),
        spec={},
        gpus_per_replica=1,
        gpu_milli_per_replica=1000,
    )


def _lifecycle(rng: random.Random, job: Any, batch: list[Any], start: datetime) -> list[Any]:
    from scheduler.models import JobEvent

    at = start + timedelta(seconds=rng.uniform(0, 30 * 86400))
    out = []

    def event(to_state: str, after_s: float, **fields: Any) -> None:
        nonlocal at
        at += timedelta(seconds=after_s)
        out.append(JobEvent(job=job, to_state=to_state, at=at, **fields))

    event("queued", 0, kind="submitted")
    event("admitted", rng.expovariate(1 / 300), from_state="queued", kind="admitted")
    event("binding", 0.2, from_state="admitted", kind="binding")
    event("running", 2, from_state="binding", kind="started")
    if rng.random() < PREEMPTED:
        by = rng.choice([*batch, None])
        data = {"preemptor": str(by.pk)} if by is not None else {}
        event("preempted", rng.uniform(60, 3600), from_state="running", kind="preempted", data=data)
        event("queued", 1, from_state="preempted", kind="requeued")
        event("admitted", rng.expovariate(1 / 600), from_state="queued", kind="admitted")
        event("running", 3, from_state="admitted", kind="started")
    event("succeeded", rng.uniform(60, 7200), from_state="running", kind="succeeded")
    return out


def arrivals(n: int) -> None:
    """`n` new events: jobs queued and admitted now, as between two scrapes."""
    from scheduler.models import Job, JobEvent

    template = Job.objects.order_by("pk").first()
    assert template is not None
    for _ in range(n // 2):
        job = Job.objects.create(
            project_id=template.project_id,
            tenant_id=template.tenant_id,
            submitted_by_id=template.submitted_by_id,
            name="new",
            job_type="training",
            state="admitted",
            priority_class_id=template.priority_class_id,
            spec={},
        )
        JobEvent.objects.create(job=job, to_state="queued", kind="submitted")
        JobEvent.objects.create(job=job, to_state="admitted", from_state="queued")


def timed_scrapes(scrapes: int, counters: Callable[..., Any]) -> tuple[list[float], list[float]]:
    """Milliseconds of each whole-collector scrape, with `counters` serving the counters, and
    of the counters' part of it."""
    from prometheus_client import generate_latest
    from prometheus_client.core import CollectorRegistry

    from scheduler.metrics import exporter as metrics

    spent: list[float] = []

    def timed(now: datetime) -> Any:
        began = time.perf_counter()
        try:
            return counters(now=now)
        finally:
            spent.append((time.perf_counter() - began) * 1000)

    metrics.job_event_tallies = timed  # type: ignore[assignment]
    registry = CollectorRegistry(auto_describe=False)
    registry.register(metrics.GantryCollector())
    whole = []
    for _ in range(scrapes):
        arrivals(50)
        began = time.perf_counter()
        generate_latest(registry)
        whole.append((time.perf_counter() - began) * 1000)
    return whole, spent


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", default=DEFAULT_URL)
    parser.add_argument("--jobs", type=int, default=100_000)
    parser.add_argument("--scrapes", type=int, default=10)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    fresh_database(args.url)
    from django.db import connection

    from scheduler.metrics.recount import recount
    from scheduler.metrics.tally import job_event_tallies

    began = time.perf_counter()
    events = history(args.jobs, datetime.now(UTC) - timedelta(days=31))
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE")
    filled_s = time.perf_counter() - began
    before, before_counters = timed_scrapes(args.scrapes, lambda now: recount())
    began = time.perf_counter()
    job_event_tallies(now=datetime.now(UTC))  # the first scrape settles the history
    settle_ms = (time.perf_counter() - began) * 1000
    after, after_counters = timed_scrapes(args.scrapes, job_event_tallies)
    median = statistics.median
    result = {
        "jobs": args.jobs,
        "events": events,
        "fill_s": round(filled_s, 1),
        "before_scrape_ms_median": round(median(before), 1),
        "before_counters_ms_median": round(median(before_counters), 1),
        "first_settling_counters_ms": round(settle_ms, 1),
        "after_scrape_ms_median": round(median(after), 1),
        "after_counters_ms_median": round(median(after_counters), 1),
        "scrape_ratio": round(median(before) / median(after), 1),
        "counters_ratio": round(median(before_counters) / median(after_counters), 1),
    }
    text = json.dumps(result, indent=2)
    print(text)
    if args.json:
        args.json.write_text(text + "\n")


if __name__ == "__main__":
    main()
