"""The cost routes on an open month: one request's CPU and wall, its queries.

    python -m bench.cost_reads --gpus 64 --days 30 --jobs 30000

Builds bench/billing.py's month in a fresh PostgreSQL database (`--url`, default
DATABASE_URL or postgres://postgres@127.0.0.1:5432/bench_cost_reads; it is dropped and
created) and meters it, but closes nothing: every hour is rated from the usage records on
each request, as at the end of a month not closed yet. Then, as a finance user, it requests
`GET /api/v1/costs/` over the whole period (by team and by user) and the portal's
`GET /costs/` of its month, `--repeat` times each after one warm-up, through Django's test
client in this process (no web server), and reports per route the median CPU seconds of this
process, the median wall seconds (the database's time included), the queries of one request
and the status: `cold`, with the kept lines forgotten before each request (the rating a
memo miss does: billing/statements/line_memo.py), and `warm`, with them kept. A loaded host inflates
both: give the load average with the figures.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from typing import Any

from bench.billing import Month, build, meter, shape

DEFAULT_URL = "postgres://postgres@127.0.0.1:5432/bench_cost_reads"


def routes(month: Month) -> list[str]:
    window = f"from={month.start:%Y-%m-%dT%H:%M:%SZ}&to={month.end:%Y-%m-%dT%H:%M:%SZ}"
    return [
        f"/api/v1/costs/?{window}&by=team",
        f"/api/v1/costs/?{window}&by=user",
        f"/costs/?month={month.start:%Y-%m}",
    ]


def measure(month: Month, repeat: int) -> dict[str, Any]:
    """Each route's figures, as a finance user (every organisation, the cluster's page):
    `cold`, the kept lines forgotten before each request (billing/statements/line_memo.py), so the
    request rates the open month, as the first reader after a change does; `warm`, the lines
    kept, as every other reader finds them."""
    from django.contrib.auth import get_user_model
    from django.core.cache import cache
    from django.test import Client

    from billing.statements import line_memo
    from tenants.models import PlatformRole, PlatformRoleName

    user, _ = get_user_model().objects.get_or_create(username="bench-finance")
    PlatformRole.objects.get_or_create(user=user, role=PlatformRoleName.FINANCE)
    client = Client()
    client.force_login(user)
    out: dict[str, Any] = {}
    for url in routes(month):
        client.get(url)  # warm-up: content types, templates
        figures: dict[str, Any] = {}
        for kind in ("cold", "warm"):
            cpu, wall = [], []
            for _ in range(repeat):
                if kind == "cold":
                    cache.clear()
                    line_memo.forget_built()
                status, queries, seconds = _request(client, url)
                cpu.append(seconds[0])
                wall.append(seconds[1])
            figures[kind] = {
                "queries": queries,
                "cpu_s": round(statistics.median(cpu), 3),
                "wall_s": round(statistics.median(wall), 3),
            }
        out[url] = {"status": status, **figures}
    return out


def _request(client: Any, url: str) -> tuple[int, int, tuple[float, float]]:
    """One request: its status, its queries, and this process's CPU and the wall seconds."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    began, began_cpu = time.perf_counter(), time.process_time()
    with CaptureQueriesContext(connection) as queries:
        response = client.get(url)
    seconds = (time.process_time() - began_cpu, time.perf_counter() - began)
    return response.status_code, len(queries.captured_queries), seconds


def run_here(gpus: int, days: int, jobs: int, seed: int, repeat: int = 1) -> dict[str, Any]:
    """Build, meter and measure on the database Django is set up on (the smoke test's)."""
    month = shape(gpus, days, jobs, seed)
    build(month)
    meter(month)
    return measure(month, repeat)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--gpus", type=int, default=64, help="GPUs, on nodes of 8")
    parser.add_argument("--days", type=int, default=30, help="length of the period, days")
    parser.add_argument("--jobs", type=int, default=30000, help="jobs in the period")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--repeat", type=int, default=3, help="requests per route, measured")
    parser.add_argument("--url", default=os.environ.get("DATABASE_URL") or DEFAULT_URL)
    parser.add_argument("--json", help="write the result here too")
    args = parser.parse_args(argv)
    if not args.url.startswith(("postgres://", "postgresql://")):
        parser.error(f"--url {args.url!r}: PostgreSQL only (it drops and creates its database)")
    from bench.daemon_setup import fresh_database

    fresh_database(args.url)
    from django.conf import settings

    settings.ALLOWED_HOSTS = [*settings.ALLOWED_HOSTS, "testserver"]
    result = {
        "gpus": args.gpus,
        "days": args.days,
        "jobs": args.jobs,
        "seed": args.seed,
        **run_here(args.gpus, args.days, args.jobs, args.seed, args.repeat),
        "loadavg": open("/proc/loadavg").read().split()[:3],  # noqa: SIM115
    }
    print(json.dumps(result, indent=2))
    if args.json:
        with open(args.json, "w") as out:
            out.write(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
