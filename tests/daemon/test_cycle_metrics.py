"""The daemon's cycles as Kueue's admission attempts, served by the daemon's own /metrics
(scheduler/metrics/cycles.py): the web server cannot see a cycle's time (issue 20)."""

from __future__ import annotations

import signal
import urllib.request
from io import StringIO
from typing import Any

import pytest
from django.core.management import call_command
from prometheus_client import generate_latest

from scheduler.daemon.loop import Daemon
from scheduler.metrics.cycles import CycleMetrics
from tests.daemon.conftest import Env
from tests.metrics.helpers import value


def test_each_cycle_is_an_attempt_with_its_result_and_time(env: Env) -> None:
    cycles = CycleMetrics()
    daemon = env.daemon(on_cycle=cycles.on_cycle)
    env.run(daemon)  # nothing waits
    env.submit()
    env.run(daemon, seconds=1)  # admitted
    env.submit(replicas=4, resources={"gpus": 8})  # the whole cluster, 4 GPUs of it taken: waits
    env.run(daemon, seconds=1)
    text = generate_latest(cycles.registry).decode()
    for result in ("idle", "success", "inadmissible"):
        assert value(text, "gantry_admission_attempts_total", result=result) == 1, result
        count = value(text, "gantry_admission_attempt_duration_seconds_count", result=result)
        assert count == 1, result
    last = sum(daemon.last.phases_ms.values()) / 1000  # the inadmissible cycle, the last one
    seconds = value(text, "gantry_admission_attempt_duration_seconds_sum", result="inadmissible")
    assert seconds == pytest.approx(last)


def test_the_daemon_serves_its_series_over_http() -> None:
    cycles = CycleMetrics()
    cycles.observe(seconds=0.003, placed=2, considered=5)
    server = cycles.serve(0, addr="127.0.0.1")
    try:
        port = server.server_address[1]
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
            text = response.read().decode()
    finally:
        server.shutdown()
        server.server_close()
    # 3 ms: above the 2 ms bucket, within the 4 ms one.
    assert value(text, "gantry_admission_attempt_duration_seconds_bucket", result="success",
                 le="0.002") == 0  # fmt: skip
    assert value(text, "gantry_admission_attempt_duration_seconds_bucket", result="success",
                 le="0.004") == 1  # fmt: skip


def test_run_scheduler_feeds_its_cycles_to_the_served_series(
    db: None, monkeypatch: pytest.MonkeyPatch, settings: Any
) -> None:
    """The command wires the hook and serves the port (the loop stands for one cycle)."""
    settings.GANTRY_SIM_STATE_FILE = ""
    made: list[CycleMetrics] = []
    scraped: list[str] = []
    original = CycleMetrics.serve

    def serve(self: CycleMetrics, port: int, addr: str = "0.0.0.0") -> Any:
        made.append(self)
        return original(self, 0, addr="127.0.0.1")

    def one_cycle(daemon: Daemon) -> None:
        daemon.step()
        scraped.append(generate_latest(made[0].registry).decode())  # the served registry

    monkeypatch.setattr(CycleMetrics, "serve", serve)
    monkeypatch.setattr(Daemon, "run", one_cycle)
    monkeypatch.setattr(signal, "signal", lambda *_args: None)  # keep pytest's handlers
    call_command("run_scheduler", "--backend", "simulated", "--no-demo-load",
                 "--metrics-port", "9402", stdout=StringIO(), stderr=StringIO())  # fmt: skip
    (text,) = scraped
    assert value(text, "gantry_admission_attempts_total", result="idle") == 1
