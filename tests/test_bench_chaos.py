"""bench/chaos.py at a tiny scale: its own PostgreSQL cluster and Redis, two schedulers, the
web server and a Celery worker; 30 jobs through the API while the leader is killed twice,
PostgreSQL restarts once and Redis is down a few seconds. The JSON must hold the counts the
issue names, and every promise must have held. No figure is asserted."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from django.conf import settings

from bench.chaos import timeline
from bench.chaos_checks import PROMISES
from bench.chaos_env import _pg_bin

REQUIRED = ("jobs", "kills", "lost", "double_allocations", "quota_breaches", "orphan_pods")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def servers_installed() -> bool:
    try:
        _pg_bin("initdb")
    except RuntimeError:
        return False
    return shutil.which("redis-server") is not None


def test_the_timeline_spreads_every_fault_and_the_kills() -> None:
    from bench.chaos import parse

    args = parse(["--kills", "3", "--pg-restarts", "2", "--window-s", "100"])
    events = timeline(None, args)  # type: ignore[arg-type]
    names = [name for _, name in events]
    assert names.count("kill") == 3
    assert names.count("pg_restart") == 2
    others = ("freeze_idle", "freeze_write", "restart", "redis_down", "node_fail", "terminating")
    assert {fault: names.count(fault) for fault in others} == dict.fromkeys(others, 1)
    assert all(0 <= at <= 100 for at, _ in events)
    assert [at for at, _ in events] == sorted(at for at, _ in events)


@pytest.mark.postgresql("the harness runs its own PostgreSQL cluster (initdb, pg_ctl restart)")
@pytest.mark.skipif(not servers_installed(), reason="needs PostgreSQL's server and redis-server")
def test_a_tiny_chaos_run_keeps_every_promise(tmp_path: Path) -> None:
    out = tmp_path / "chaos.json"
    command = [
        sys.executable, "-m", "bench.chaos", "--json", str(out),
        "--jobs", "30", "--window-s", "20", "--runtime-s", "1", "3", "--settle-s", "90",
        "--kills", "2", "--pg-restarts", "1", "--redis-down-s", "5",
        "--no-freezes", "--no-restart", "--no-node-faults",
        "--pg-port", str(free_port()), "--redis-port", str(free_port()),
        "--web-port", str(free_port()),
    ]  # fmt: skip
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "REDIS_URL")}
    done = subprocess.run(
        command, cwd=settings.BASE_DIR, env=env, capture_output=True, text=True, timeout=600
    )
    assert out.exists(), done.stdout[-3000:] + done.stderr[-3000:]
    results = json.loads(out.read_text())
    for key in (*REQUIRED, *PROMISES, "faults", "durations_s", "params", "load_average"):
        assert key in results, key
    assert results["jobs"] == 31  # 30 through the API, 1 through the portal's form
    assert results["submitted"] == 31
    assert results["kills"] == 2
    assert results["faults"]["pg_restarts"] == 1
    assert results["faults"]["redis_down_s"] == 5
    assert {name: results[name] for name in PROMISES} == dict.fromkeys(PROMISES, 0)
    assert results["requests_redis_down"] > 0
    assert results["api_errors_redis_down"] == 0
    assert done.returncode == 0, done.stdout[-3000:]
