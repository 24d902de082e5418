"""Realistic traffic from many people at once against the deployed processes.

    python -m bench.load --json out.json [--users 200] [--duration 300] [--seed 1]
        [--think-s 30] [--ramp-s 30] [--workers 3] [--history-hours 48]
        [--url postgres://...] [--redis-url redis://...] [--pg-port 5446] [--redis-port 6406]

Starts its own PostgreSQL cluster (pg_stat_statements preloaded; `--url` for another server,
whose database it drops and creates) and Redis, migrates, seeds an organisation
(bench/load/seed.py: `--users` people with tokens and memberships, approvers, admins and one
finance user, approval policies, `--history-hours` of finished jobs, a rate card and that
history metered), then starts gunicorn with the deployment's command and `--workers` workers
(WEB_CONCURRENCY), a Celery worker and the scheduler daemon on the simulated cluster, so jobs
are scheduled while the load runs.

The virtual users run in a separate process (bench/load/client.py) so its CPU share is
measured apart: they log in to the portal (the warm-up), then for `--duration` seconds list
and filter jobs, open job pages and their HTMX partials, submit with idempotency keys
(a fifth sent twice: the repeat must return the same job), approve, and read queues,
dashboards and costs, each thinking a random time of mean `--think-s` between actions.

The default pace is a person's: 30 s on average between actions (each action is one to four
requests: a page and its partials), so 200 people send about 12 requests a second. `--think-s
5` is a stress reading, six times that traffic from the same people: what the host serves when
everyone clicks on without reading (bench/results.md gives both).

Reports, per route template, the count and p50/p95/p99 latency against its target (300 ms
for reads, 500 ms for writes), the throughput, the errors (any status of 400 or more that the
route does not expect), PostgreSQL's top statements over the window by total and by mean time,
the load average and the client's CPU share. Exit status 1 if a target is missed or any error
was seen. Figures: bench/results.md, "load".
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from bench.daemon_setup import fresh_database, percentile
from bench.load.env import ROOT, free_port, own_postgres, own_redis, product
from bench.load.seed import LOAD_PASSWORD, seed

READ_TARGET_MS, WRITE_TARGET_MS = 300.0, 500.0


def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", type=Path, help="write the results here")
    parser.add_argument("--users", type=int, default=200)
    parser.add_argument("--duration", type=float, default=300.0, help="measured seconds")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument(
        "--think-s", type=float, default=30.0, help="mean seconds between a person's actions"
    )
    parser.add_argument("--ramp-s", type=float, default=30.0, help="logins spread over this")
    parser.add_argument(
        "--form-logins", type=int, default=8, help="users who sign in through the login form"
    )
    parser.add_argument("--workers", type=int, default=3, help="gunicorn workers")
    parser.add_argument("--history-hours", type=float, default=48.0)
    parser.add_argument("--url", help="a PostgreSQL server's database URL instead of our own")
    parser.add_argument("--redis-url", help="a Redis URL instead of our own")
    parser.add_argument("--pg-port", type=int, default=5446)
    parser.add_argument("--redis-port", type=int, help="default: a free port")
    parser.add_argument("--logs", type=Path, help="keep the processes' logs here")
    args = parser.parse_args(argv)
    if args.users < 1 or args.duration <= 0 or args.think_s <= 0:
        parser.error("--users, --duration and --think-s must be positive")
    return args


@contextlib.contextmanager
def services(args: argparse.Namespace) -> Iterator[tuple[str, str]]:
    with contextlib.ExitStack() as stack:
        url = args.url or stack.enter_context(own_postgres(args.pg_port))
        redis = args.redis_url or stack.enter_context(own_redis(args.redis_port or free_port()))
        yield url, redis


def prepare(args: argparse.Namespace, url: str, redis: str, var: Path) -> dict[str, Any]:
    """A fresh database, migrated and seeded; the people the virtual users play."""
    os.environ.update(REDIS_URL=redis, GANTRY_VAR_DIR=str(var))
    fresh_database(url)
    from django.db import connection

    with contextlib.suppress(Exception), connection.cursor() as cursor:
        cursor.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
    postmaster = None
    if not args.url:  # our own cluster: its processes are the benchmark's alone
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_backend_pid()")
            backend = cursor.fetchone()[0]
        stat = Path(f"/proc/{backend}/stat").read_text().rsplit(")", 1)[1].split()
        postmaster = int(stat[1])
    started = time.monotonic()
    seeded = seed(args.users, args.history_hours, args.seed, datetime.now(UTC))
    people = [
        {**vars(p), "password": LOAD_PASSWORD, "tenant": seeded.teams.get(p.team)}
        for p in seeded.people
    ]
    connection.close()
    return {
        "people": people,
        "history_jobs": seeded.history_jobs,
        "usage_records": seeded.usage_records,
        "seed_s": round(time.monotonic() - started, 1),
        "postmaster": postmaster,
    }


def wait_healthy(base: str, timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            with urllib.request.urlopen(f"{base}/healthz", timeout=5) as response:  # noqa: S310
                if response.status == 200:
                    return
        except OSError:
            if time.monotonic() > deadline:
                raise
        time.sleep(0.5)


def statements(url: str) -> dict[str, list[dict[str, Any]]]:
    """pg_stat_statements of the benchmark's database since the window's reset."""
    import psycopg

    query = """
        SELECT round(total_exec_time::numeric, 1), round(mean_exec_time::numeric, 2), calls,
               rows, left(regexp_replace(query, '\\s+', ' ', 'g'), 4000)
        FROM pg_stat_statements
        WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database())
        ORDER BY {} DESC LIMIT 10"""
    out: dict[str, list[dict[str, Any]]] = {"by_total": [], "by_mean": []}
    keys = ("total_ms", "mean_ms", "calls", "rows", "query")
    try:
        with psycopg.connect(url, autocommit=True) as conn:
            for name, order in (("by_total", "total_exec_time"), ("by_mean", "mean_exec_time")):
                rows = conn.execute(query.format(order)).fetchall()  # type: ignore[call-overload]
                out[name] = [
                    {k: float(v) if isinstance(v, int | float) or k.endswith("_ms") else v
                     for k, v in zip(keys, row, strict=True)}
                    for row in rows
                ]  # fmt: skip
    except psycopg.Error as exc:
        out["unavailable"] = [{"error": str(exc)[:200]}]
    return out


def jobs_outcome(keys: list[list[str]]) -> dict[str, Any]:
    """The load's submissions as the database holds them: one job per idempotency key, and
    where the daemon took them."""
    from django.db.models import Count

    from scheduler.models import Job

    submitted = Job.objects.filter(idempotency_key__startswith="load-")
    per_key = submitted.values("submitted_by", "idempotency_key").annotate(n=Count("id"))
    states = dict(submitted.values_list("state").annotate(n=Count("id")))
    return {
        "keys_sent": len(keys),
        "jobs_for_keys": submitted.count(),
        "keys_with_several_jobs": sum(1 for row in per_key if row["n"] > 1),
        "states": states,
    }


def route_table(client: dict[str, Any]) -> dict[str, dict[str, Any]]:
    routes = {}
    for route, values in sorted(client["latencies"].items()):
        target = WRITE_TARGET_MS if route.startswith("POST") else READ_TARGET_MS
        p95 = percentile(values, 95)
        routes[route] = {
            "count": len(values),
            "p50_ms": round(percentile(values, 50), 1),
            "p95_ms": round(p95, 1),
            "p99_ms": round(percentile(values, 99), 1),
            "max_ms": round(max(values), 1),
            "target_ms": target,
            "pass": p95 < target,
            "statuses": client["statuses"].get(route, {}),
            "solo_wall_ms": client["solo"].get(route, {}).get("wall_ms"),
            "solo_web_cpu_ms": client["solo"].get(route, {}).get("web_cpu_ms"),
        }
    return routes


def run(args: argparse.Namespace) -> dict[str, Any]:
    loadavg_before = Path("/proc/loadavg").read_text().split()[:3]
    with tempfile.TemporaryDirectory(prefix="gantry-load-") as tmp, services(args) as (url, redis):
        logs = args.logs or Path(tmp) / "logs"
        prepared = prepare(args, url, redis, logs / "var")
        with product(url, redis, args.workers, logs) as (stack, base):
            wait_healthy(base)
            plan = {
                "base_url": base,
                "people": prepared["people"],
                "users": args.users,
                "duration_s": args.duration,
                "think_s": args.think_s,
                "ramp_s": args.ramp_s,
                "form_logins": args.form_logins,
                "seed": args.seed,
                "database_url": url,
                "cpu_groups": {name: proc.pid for name, proc in stack.procs.items()},
                "postmaster": prepared["postmaster"],
            }
            (Path(tmp) / "plan.json").write_text(json.dumps(plan))
            subprocess.run(  # noqa: S603 - our own module
                [sys.executable, "-m", "bench.load.client", f"{tmp}/plan.json", f"{tmp}/out.json"],
                cwd=ROOT,
                check=True,
                timeout=args.duration + args.ramp_s + 600,
            )
            client = json.loads((Path(tmp) / "out.json").read_text())
            stack.check_alive()
            slowest = statements(url)
            outcome = jobs_outcome(client["idempotency"]["keys"])
    routes = route_table(client)
    requests = sum(r["count"] for r in routes.values())
    errors = client["error_count"] + client["login_failed"]
    return {
        "parameters": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "loadavg": {
            "before": loadavg_before,
            "window_start": client["loadavg_start"],
            "window_end": client["loadavg_end"],
        },
        "cpus": os.cpu_count(),
        "history_jobs": prepared["history_jobs"],
        "usage_records": prepared["usage_records"],
        "seed_s": prepared["seed_s"],
        "wall_s": round(client["wall_s"], 1),
        "requests": requests,
        "throughput_rps": round(requests / client["wall_s"], 1) if client["wall_s"] else 0.0,
        "errors": errors,
        "error_rate": round(errors / requests, 4) if requests else 0.0,
        "error_list": client["errors"],
        "login_failed": client["login_failed"],
        "warmup": client["warmup"],
        "client_cpu_s": round(client["client_cpu_s"], 1),
        "client_cpu_share": round(client["client_cpu_share"], 3),
        # What the product's processes used in the window, and per request: what the
        # throughput would be on this many idle cores, whatever else shares the host.
        "server_cpu_s": {k: round(v, 1) for k, v in client["server_cpu_s"].items()},
        "server_cpu_ms_per_request": round(
            1000 * sum(client["server_cpu_s"].values()) / requests, 1
        )
        if requests
        else 0.0,
        "routes": routes,
        "timeline": client["timeline"],
        "idempotency": {
            "retries": client["idempotency"]["retries"],
            "duplicates": client["idempotency"]["duplicates"],
            **outcome,
        },
        "slowest_statements": slowest if client["statements_reset"] else {"unavailable": []},
        "passed": errors == 0
        and all(r["pass"] for r in routes.values())
        and client["idempotency"]["duplicates"] == 0
        and outcome["keys_with_several_jobs"] == 0,
    }


def report(result: dict[str, Any]) -> str:
    lines = [
        f"{result['requests']} requests in {result['wall_s']} s: {result['throughput_rps']} req/s,"
        f" {result['errors']} errors; load average {' '.join(result['loadavg']['window_start'])}"
        f" -> {' '.join(result['loadavg']['window_end'])} on {result['cpus']} CPUs;"
        f" client CPU share {result['client_cpu_share']:.1%};"
        f" product CPU s {result['server_cpu_s']},"
        f" {result['server_cpu_ms_per_request']} ms per request",
        f"{'route':<48} {'count':>6} {'p50':>7} {'p95':>7} {'p99':>7} {'target':>6}"
        "      solo: wall  web CPU (ms)",
    ]
    for route, r in result["routes"].items():
        verdict = "PASS" if r["pass"] else "FAIL"
        lines.append(
            f"{route:<48} {r['count']:>6} {r['p50_ms']:>7} {r['p95_ms']:>7} {r['p99_ms']:>7}"
            f" {r['target_ms']:>6.0f} {verdict}"
            f" {r['solo_wall_ms'] or '':>12.6} {r['solo_web_cpu_ms'] or '':>8.6}"
        )
    for error in result["error_list"][:10]:
        lines.append(f"error: {error['route']} {error['status']} {error['body'][:120]!r}")
    lines.append(f"idempotency: {result['idempotency']}")
    for row in result["slowest_statements"].get("by_total", [])[:5]:
        lines.append(
            f"sql {row['total_ms']:>10} ms total {row['mean_ms']:>8} ms mean: {row['query'][:100]}"
        )
    lines.append("PASS" if result["passed"] else "FAIL")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    result = run(args)
    print(report(result))
    if args.json:
        args.json.write_text(json.dumps(result, indent=2, default=str))
    return 0 if result["passed"] else 1
