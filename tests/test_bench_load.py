"""bench.load at a tiny scale: its own PostgreSQL cluster and Redis, gunicorn, a Celery worker
and the daemon started as the benchmark starts them, three virtual users for a few seconds.
Checks what the JSON reports (its keys, and that the run saw no error and no duplicate job),
never the times."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from bench.load.env import ROOT, free_port

KEYS = {
    "requests",
    "errors",
    "error_rate",
    "error_list",
    "throughput_rps",
    "routes",
    "slowest_statements",
    "parameters",
    "loadavg",
    "client_cpu_share",
    "server_cpu_s",
    "idempotency",
    "passed",
}
ROUTE_KEYS = {"count", "p50_ms", "p95_ms", "p99_ms", "target_ms", "pass", "solo_web_cpu_ms"}


@pytest.mark.postgresql("the benchmark starts its own PostgreSQL cluster (initdb, pg_ctl)")
def test_bench_load_reports_routes_errors_and_statements(tmp_path: Path) -> None:
    if shutil.which("redis-server") is None:
        pytest.skip("redis-server is not installed")
    out = tmp_path / "out.json"
    argv = [
        sys.executable, "-m", "bench.load", "--users", "3", "--duration", "4", "--ramp-s", "1",
        "--think-s", "0.5", "--history-hours", "1", "--workers", "1", "--pg-port", str(free_port()),
        "--redis-port", str(free_port()), "--json", str(out),
    ]  # fmt: skip
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "REDIS_URL")}
    # a bound on liveness, not a timing: the run (its own PostgreSQL, Redis, web and worker)
    # took ~30 s on a quiet host and over 180 s at load 17
    done = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode in (0, 1), done.stderr[-3000:]
    result = json.loads(out.read_text())
    assert set(result) >= KEYS
    assert result["requests"] > 0
    assert result["errors"] == 0, result["error_list"]
    for route, figures in result["routes"].items():
        assert set(figures) >= ROUTE_KEYS, route
    # The timeline holds every request of the window, in buckets of its seconds.
    assert sum(bucket["requests"] for bucket in result["timeline"]) == result["requests"]
    assert {"by_total", "by_mean"} <= set(result["slowest_statements"])
    assert result["slowest_statements"]["by_total"], "pg_stat_statements read nothing"
    assert result["idempotency"]["duplicates"] == 0
    assert result["idempotency"]["keys_with_several_jobs"] == 0
