"""The load benchmark's processes: its own PostgreSQL cluster and Redis, then gunicorn, a Celery
worker and the scheduler daemon as the deployment starts them (docs/deployment.md).

The benchmark reads pg_stat_statements, which needs `shared_preload_libraries` and so a server
start: it starts a throw-away cluster of its own (initdb, pg_ctl) in a temporary directory
rather than reconfigure a shared server. `--url` points it at another server instead (its
statements are then read only if that server preloads the library).
"""

from __future__ import annotations

import contextlib
import glob
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _pg_bin(name: str) -> str:
    found = sorted(glob.glob(f"/usr/lib/postgresql/*/bin/{name}")) or [shutil.which(name) or ""]
    if not found[-1]:
        raise SystemExit(f"{name} not found: install PostgreSQL or pass --url")
    return found[-1]


def _as_postgres(argv: list[str]) -> list[str]:
    """PostgreSQL refuses to run as root: run its tools as the `postgres` user then."""
    return ["runuser", "-u", "postgres", "--", *argv] if os.geteuid() == 0 else argv


@contextlib.contextmanager
def own_postgres(port: int) -> Iterator[str]:
    """A fresh cluster on 127.0.0.1:`port` with pg_stat_statements preloaded; the URL of its
    database `gantry_load`. Stopped and removed on exit."""
    data = Path(tempfile.mkdtemp(prefix="gantry-load-pg-"))
    if os.geteuid() == 0:
        shutil.chown(data, "postgres", "postgres")
    pgdata = data / "data"
    subprocess.run(  # noqa: S603 - the PostgreSQL tools, our arguments
        _as_postgres([_pg_bin("initdb"), "-D", str(pgdata), "-U", "postgres", "-A", "trust"]),
        check=True,
        stdout=subprocess.DEVNULL,
    )
    options = (
        f"-p {port} -k {data} -c listen_addresses=127.0.0.1"
        " -c shared_preload_libraries=pg_stat_statements -c pg_stat_statements.track=top"
        " -c max_connections=300 -c shared_buffers=256MB -c fsync=on"
    )
    ctl = _pg_bin("pg_ctl")
    subprocess.run(  # noqa: S603 - the PostgreSQL tools, our arguments
        _as_postgres(
            [ctl, "-D", str(pgdata), "-o", options, "-l", str(data / "log"), "-w", "start"]
        ),
        check=True,
        stdout=subprocess.DEVNULL,
    )
    try:
        yield f"postgres://postgres@127.0.0.1:{port}/gantry_load"
    finally:
        subprocess.run(  # noqa: S603 - the PostgreSQL tools, our arguments
            _as_postgres([ctl, "-D", str(pgdata), "-m", "fast", "-w", "stop"]),
            check=False,
            stdout=subprocess.DEVNULL,
        )
        shutil.rmtree(data, ignore_errors=True)


@contextlib.contextmanager
def own_redis(port: int) -> Iterator[str]:
    server = shutil.which("redis-server")
    if server is None:
        raise SystemExit("redis-server not found: install Redis or pass --redis-url")
    proc = subprocess.Popen(  # noqa: S603 - our arguments
        [
            server,
            "--bind",
            "127.0.0.1",
            "--port",
            str(port),
            "--save",
            "",
            "--appendonly",
            "no",
        ],
        stdout=subprocess.DEVNULL,
    )
    try:
        _wait_port(port, 10)
        yield f"redis://127.0.0.1:{port}/0"
    finally:
        proc.terminate()
        proc.wait(10)


def _wait_port(port: int, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 0.5):
            return
        time.sleep(0.1)
    raise SystemExit(f"nothing listens on port {port} after {timeout_s} s")


@dataclass
class Stack:
    """The product's processes, each in its own process group, logs under `logs`."""

    env: dict[str, str]
    logs: Path
    procs: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)

    def start(self, name: str, argv: list[str]) -> None:
        out = (self.logs / f"{name}.log").open("wb")
        self.procs[name] = subprocess.Popen(  # noqa: S603 - our own argv
            argv,
            cwd=ROOT,
            env=self.env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    def check_alive(self) -> None:
        for name, proc in self.procs.items():
            if proc.poll() is not None:
                tail = (self.logs / f"{name}.log").read_text(errors="replace")[-3000:]
                raise SystemExit(f"{name} exited with {proc.returncode}:\n{tail}")

    def stop(self) -> None:
        for proc in self.procs.values():
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
        for proc in self.procs.values():
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(5)


def product_env(database_url: str, redis_url: str, var_dir: Path) -> dict[str, str]:
    """The processes' environment: production-like (no DEBUG, which would keep every query's
    SQL in memory), on the simulated cluster."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GANTRY_", "DJANGO_"))}
    env.update(
        DATABASE_URL=database_url,
        REDIS_URL=redis_url,
        DJANGO_SETTINGS_MODULE="config.settings",
        DJANGO_DEBUG="0",
        GANTRY_VAR_DIR=str(var_dir),
        GANTRY_CLUSTER_BACKEND="simulated",
        GANTRY_LOG_LEVEL="WARNING",
        PYTHONPATH=str(ROOT),
    )
    return env


@contextlib.contextmanager
def product(
    database_url: str, redis_url: str, workers: int, logs: Path
) -> Iterator[tuple[Stack, str]]:
    """gunicorn (the deployment's command, `workers` sync workers as WEB_CONCURRENCY), one
    Celery worker and one scheduler daemon. Yields the stack and the web's base URL."""
    logs.mkdir(parents=True, exist_ok=True)
    env = product_env(database_url, redis_url, logs / "var")
    env["WEB_CONCURRENCY"] = str(workers)
    port = free_port()
    python = sys.executable
    stack = Stack(env=env, logs=logs)
    try:
        stack.start(
            "web",
            [
                python, "-m", "gunicorn", "config.wsgi:application",
                "--bind", f"127.0.0.1:{port}", "--worker-tmp-dir", "/dev/shm",  # noqa: S108 - as deployed
                "--access-logfile", "-", "--timeout", "60",
            ],
        )  # fmt: skip
        stack.start("worker", [python, "-m", "celery", "-A", "config", "worker", "-l", "warning"])
        stack.start("scheduler", [python, "manage.py", "run_scheduler"])
        _wait_port(port, 60)
        stack.check_alive()
        yield stack, f"http://127.0.0.1:{port}"
    finally:
        stack.stop()


def cpu_seconds(groups: dict[str, int], postmaster: int | None) -> dict[str, float]:
    """CPU seconds used so far by the live processes of each process group in `groups`
    (name -> group id), and by PostgreSQL's postmaster and its children (`postgres`)."""
    tick = os.sysconf("SC_CLK_TCK")
    out = dict.fromkeys([*groups, *(["postgres"] if postmaster else [])], 0.0)
    names = {group: name for name, group in groups.items()}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:  # exited meanwhile
            continue
        pid, ppid, group = int(stat.parent.name), int(fields[1]), int(fields[2])
        used = (int(fields[11]) + int(fields[12])) / tick
        if group in names:
            out[names[group]] += used
        elif postmaster and postmaster in (pid, ppid):
            out["postgres"] += used
    return out
