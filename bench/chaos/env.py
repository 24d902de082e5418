"""The chaos benchmark's own services and processes: a PostgreSQL cluster and a Redis server
it may restart and stop without touching anyone else's, and the Gantry processes it kills.

The PostgreSQL cluster lives in the run's temporary directory, on its own port: initdb and
pg_ctl from the installed server (as the `postgres` OS user when run as root, since the server
refuses to run as root). Redis is a plain `redis-server` child without persistence.
"""

from __future__ import annotations

import contextlib
import glob
import os
import pwd
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

BASE_DIR = Path(__file__).resolve().parents[2]


def _pg_bin(name: str) -> str:
    found = sorted(glob.glob(f"/usr/lib/postgresql/*/bin/{name}"))
    if found:
        return found[-1]
    path = shutil.which(name)
    if path is None:
        raise RuntimeError(f"{name} not found (install PostgreSQL's server package)")
    return path


def _as_postgres(command: list[str]) -> list[str]:
    """The server refuses to run as root: run its tools as the `postgres` OS user then."""
    if os.geteuid() != 0:
        return command
    return ["runuser", "-u", "postgres", "--", *command]


@dataclass
class PgCluster:
    """A throwaway PostgreSQL cluster under `root` on `port` (trust authentication)."""

    root: Path
    port: int
    restarts: int = 0

    @property
    def data(self) -> Path:
        return self.root / "pgdata"

    @property
    def url(self) -> str:
        return f"postgres://postgres@127.0.0.1:{self.port}/gantry_chaos"

    def _ctl(self, *args: str) -> None:
        command = [_pg_bin("pg_ctl"), "-D", str(self.data), "-l", str(self.root / "pg.log")]
        subprocess.run(_as_postgres([*command, *args]), check=True, capture_output=True)  # noqa: S603

    def start(self) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        if os.geteuid() == 0:
            user = pwd.getpwnam("postgres")
            os.chown(self.root, user.pw_uid, user.pw_gid)
        init = [_pg_bin("initdb"), "-D", str(self.data), "-U", "postgres", "--auth=trust"]
        subprocess.run(_as_postgres(init), check=True, capture_output=True)  # noqa: S603 - ours
        # A benchmark's cluster: durability is not what is measured (a fast restart is clean).
        options = (
            f"-p {self.port} -k {self.root} -c listen_addresses=127.0.0.1 -c fsync=off "
            "-c synchronous_commit=off -c full_page_writes=off -c max_connections=200"
        )
        self._ctl("-o", options, "-w", "start")
        subprocess.run(  # noqa: S603 - the installed server's client, our own arguments
            [_pg_bin("psql"), "-h", "127.0.0.1", "-p", str(self.port), "-U", "postgres",
             "-c", "CREATE DATABASE gantry_chaos"],
            check=True, capture_output=True,
        )  # fmt: skip

    def restart(self) -> None:
        self._ctl("-m", "fast", "-w", "restart")
        self.restarts += 1

    def stop(self) -> None:
        with contextlib.suppress(subprocess.CalledProcessError):
            self._ctl("-m", "immediate", "-w", "stop")


@dataclass
class RedisServer:
    port: int
    log: Path
    process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        command = ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1",
                   "--save", "", "--appendonly", "no"]  # fmt: skip
        handle = self.log.open("ab")
        self.process = subprocess.Popen(command, stdout=handle, stderr=subprocess.STDOUT)  # noqa: S603
        for _ in range(100):
            with contextlib.suppress(OSError):
                import socket

                with socket.create_connection(("127.0.0.1", self.port), timeout=0.5):
                    return
            time.sleep(0.1)
        raise RuntimeError(f"redis-server did not start on port {self.port}")

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            self.process.wait(timeout=10)
        self.process = None


@dataclass
class Proc:
    """One Gantry process of the run, its output in `log`."""

    name: str
    command: Sequence[str]
    env: dict[str, str]
    log: Path
    process: subprocess.Popen[bytes] = field(init=False)

    def start(self) -> Proc:
        handle = self.log.open("ab")
        self.process = subprocess.Popen(  # noqa: S603 - Gantry's own commands
            list(self.command), cwd=BASE_DIR, env=self.env, stdout=handle,
            stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
        return self

    @property
    def pid(self) -> int:
        return self.process.pid

    def alive(self) -> bool:
        return self.process.poll() is None

    def signal(self, number: int) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.process.pid, number)

    def stop(self, grace_s: float = 10.0) -> None:
        """SIGTERM the process's group (gunicorn's and Celery's children too), SIGKILL after
        `grace_s`."""
        if not self.alive():
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGCONT)
            os.killpg(self.process.pid, signal.SIGTERM)
        try:
            self.process.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(timeout=10)


def manage(*args: str) -> list[str]:
    return [sys.executable, str(BASE_DIR / "manage.py"), *args]


def venv_tool(name: str) -> str:
    return str(Path(sys.executable).parent / name)
