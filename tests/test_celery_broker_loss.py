"""A Celery worker on Redis outlives a Redis outage that catches it running a task.

Found by bench/chaos/ (issue 21): with Celery 5.7.0 the worker, on losing Redis while a
task was unacknowledged (Gantry acknowledges late, CELERY_TASK_ACKS_LATE), closed the broken
connection, and closing the channel raised AttributeError ("'NoneType' object has no attribute
'hostname'"): "Unrecoverable error", the worker exited, and nothing ran once Redis was back
until something restarted it. pyproject.toml excludes that release.

The worker runs Gantry's broker settings (acks late, reject on worker lost) on a private
redis-server, with a task still running when Redis stops; once Redis is back, the worker
must run the next task.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from django.conf import settings

APP = """
import time
from celery import Celery

app = Celery("brokerloss", broker="redis://127.0.0.1:{port}/0")
app.conf.task_acks_late = {acks_late}
app.conf.task_reject_on_worker_lost = {reject}
app.conf.broker_connection_retry_on_startup = True


@app.task
def running(marker, seconds):
    open(marker, "w").close()
    time.sleep(seconds)
"""


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def wait_for(condition: Callable[[], bool], what: str, limit_s: float = 60.0) -> None:
    """Poll `condition` until it holds; fail saying `what` did not happen. A bound against a
    hang, not a timing assertion."""
    deadline = time.monotonic() + limit_s
    while not condition():
        if time.monotonic() > deadline:
            pytest.fail(f"{what} within {limit_s} s")
        time.sleep(0.1)


def redis_answers(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5):
            return True
    except OSError:
        return False


def start_redis(port: int) -> subprocess.Popen[bytes]:
    redis = subprocess.Popen(
        ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "",
         "--appendonly", "no"],
        stdout=subprocess.DEVNULL,
    )  # fmt: skip
    wait_for(lambda: redis_answers(port), "redis-server did not start")
    return redis


@pytest.mark.backend_independent("a Celery app of its own on a redis-server of its own")
@pytest.mark.skipif(shutil.which("redis-server") is None, reason="needs redis-server")
def test_celery_worker_survives_redis_stopping_while_a_late_acked_task_runs(
    tmp_path: Path,
) -> None:
    port = free_port()
    (tmp_path / "brokerloss.py").write_text(
        APP.format(
            port=port,
            acks_late=settings.CELERY_TASK_ACKS_LATE,
            reject=settings.CELERY_TASK_REJECT_ON_WORKER_LOST,
        )
    )
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")]),
    }

    def send(marker: Path, seconds: float) -> None:
        code = f"import brokerloss; brokerloss.running.delay({str(marker)!r}, {seconds})"
        subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env, check=True)

    redis = start_redis(port)
    log = tmp_path / "worker.log"
    with log.open("wb") as output:  # the child keeps its own copy of the descriptor
        worker = subprocess.Popen(
            [sys.executable, "-m", "celery", "-A", "brokerloss", "worker", "--concurrency", "1",
             "--loglevel", "WARNING", "--without-mingle", "--without-gossip"],
            cwd=tmp_path, env=env, stdout=output, stderr=subprocess.STDOUT,
        )  # fmt: skip
    try:
        send(tmp_path / "first", 3)
        wait_for((tmp_path / "first").exists, "the first task did not start")
        redis.send_signal(signal.SIGTERM)  # while the first task runs, unacknowledged
        redis.wait(timeout=10)
        redis = start_redis(port)
        send(tmp_path / "second", 0)

        def ran_or_died() -> bool:
            return (tmp_path / "second").exists() or worker.poll() is not None

        wait_for(ran_or_died, "the worker neither ran the next task nor exited")
        assert worker.poll() is None, log.read_text(errors="replace")[-3000:]
        assert (tmp_path / "second").exists()
    finally:
        for process in (worker, redis):
            if process.poll() is None:
                process.kill()
                process.wait(timeout=10)
