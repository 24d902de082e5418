"""bench/chaos/ at a tiny scale: its own PostgreSQL cluster and Redis, two schedulers, the
web server and a Celery worker; 30 jobs through the API while the leader is killed twice,
PostgreSQL restarts once and Redis is down a few seconds; and, with a second cluster, one run
in which it is lost past its deadline and healed. The JSON must hold the counts the issue
names, and every promise must have held. No figure is asserted."""

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
from bench.chaos.checks import PROMISES
from bench.chaos.clusters import MUST_BE_ZERO
from bench.chaos.env import _pg_bin

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


def test_a_job_running_in_both_clusters_is_counted_apart_from_the_outage(tmp_path: Path) -> None:
    """The sampler's count must be able to fail: a job Running in both clusters while both
    answer is `ran_on_two_clusters` (must be 0); while site-b is silent, the design's window."""
    from bench.chaos.clusters import LostCluster
    from scheduler.backends.simulated.inventory import make_nodes
    from scheduler.backends.simulated.statefile import PersistentCluster
    from tests.daemon.conftest import FakeClock
    from tests.k8s.builders import make_request

    clock = FakeClock()

    def cluster(name: str) -> PersistentCluster:
        nodes = make_nodes(2, "G3", 8, prefix="n")
        return PersistentCluster(nodes, tmp_path / name, clock=clock, observer=True)

    home, other = cluster("home.state"), cluster("home.state.site-b")
    for job, node in ((5, "n-0000"), (6, "n-0001")):
        for backend in (home, other):
            request = make_request(job, node=node, sim_duration_s=600.0)
            backend.create_pod(request)
            backend.bind_pod(request.namespace, request.name, node)
    clock.advance(2)
    loss = LostCluster(home, other, "", lost_after_s=8, grace_s=8, down_s=35, stall_s=0)
    loss.sample()
    assert dict(loss.twice) == {"answering": {5, 6}}
    other.lose(stall_s=0)
    other.delete_pod("team-a", make_request(5).name, 0)  # the observer sees through it
    loss.sample()
    assert dict(loss.twice) == {"answering": {5, 6}, "outage": {6}}


@pytest.mark.postgresql("the harness runs its own PostgreSQL cluster (initdb, pg_ctl restart)")
@pytest.mark.skipif(not servers_installed(), reason="needs PostgreSQL's server and redis-server")
def test_a_tiny_run_with_a_cluster_lost_and_healed_keeps_every_promise(tmp_path: Path) -> None:
    """site-b goes silent 35 s (its deadline 8 s, the node-lost grace 8 s) with three long
    jobs and some of the load on it, then answers with their stale pods still running."""
    out = tmp_path / "chaos.json"
    command = [
        sys.executable, "-m", "bench.chaos", "--json", str(out),
        "--jobs", "20", "--window-s", "30", "--runtime-s", "1", "3", "--settle-s", "200",
        "--kills", "1", "--pg-restarts", "0", "--redis-down-s", "0",
        "--no-freezes", "--no-restart", "--no-node-faults",
        "--lose-cluster", "--lose-at", "0.1", "--lost-after-s", "8",
        "--node-lost-grace-s", "8", "--lost-down-s", "35",
        "--pg-port", str(free_port()), "--redis-port", str(free_port()),
        "--web-port", str(free_port()),
    ]  # fmt: skip
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "REDIS_URL")}
    done = subprocess.run(
        command, cwd=settings.BASE_DIR, env=env, capture_output=True, text=True, timeout=600
    )
    assert out.exists(), done.stdout[-3000:] + done.stderr[-3000:]
    results = json.loads(out.read_text())
    lost = results["lose_cluster"]
    assert results["jobs"] == 23  # 20 of the load, 3 long ones preferring site-b
    assert {name: results[name] for name in PROMISES} == dict.fromkeys(PROMISES, 0)
    assert {name: lost[name] for name in MUST_BE_ZERO} == dict.fromkeys(MUST_BE_ZERO, 0)
    assert lost["long_jobs_on_site_b"] == 3
    assert lost["stale_pods_at_heal"] >= 3  # the scenario did what it is for
    assert done.returncode == 0, done.stdout[-3000:]
