"""`manage.py run_embedded`: what `make run` starts, supervised. The web server, a Celery worker
with its beat, and the scheduler daemon run as child processes, each in its own process
group; this process forwards one SIGTERM to each group when it is told to stop (SIGINT,
SIGTERM) or when one of them dies, waits `--grace` seconds for them to finish their work,
then kills what is left.

The links in emails (approvals, job events, idle rules) name the portal by GANTRY_BASE_URL;
when it is not set, the children get the address this command serves on (`base_url`), so
`make run PORT=8200` mails links to port 8200, not to the settings' default.

A shell trap (`trap 'kill 0' EXIT INT TERM`) did this before: its `kill 0` signalled the
shell itself, which ran the trap again, thousands of times, and left the scheduler hanging.
"""

from __future__ import annotations

import contextlib
import ipaddress
import os
import signal
import socket
import subprocess
import sys
import time
from typing import Any

from django.core.management.base import BaseCommand, CommandError

# Every queue of config/settings.py's GANTRY_CELERY_QUEUES (notifications, reports beside the
# default). The thread pool has no Celery time limits: the webhook's deadline and the runs'
# own time limits (whatif/runs.py, billing/exports/runs.py) bound the tasks here.
WORKER_OPTIONS = (
    "--loglevel=INFO",
    "--concurrency=2",
    "--pool=threads",
    "--queues=celery,notifications,reports",
)


def commands(host: str, port: int, var_dir: str) -> dict[str, list[str]]:
    python = sys.executable
    return {
        "worker": [
            python,
            "-m",
            "celery",
            "-A",
            "config",
            "worker",
            "--beat",
            *WORKER_OPTIONS,
            f"--schedule={var_dir}/celerybeat-schedule",
        ],
        "scheduler": [python, "manage.py", "run_scheduler"],
        "web": [python, "manage.py", "runserver", "--noreload", f"{host}:{port}"],
    }


def base_url(host: str, port: int) -> str:
    """The portal's address as a browser on this machine or the network reaches it: a
    wildcard address (0.0.0.0, ::) is no address to visit, so the machine's name stands for
    it; an IPv6 address is bracketed."""
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return f"http://{host}:{port}"
    if address.is_unspecified:
        return f"http://{socket.getfqdn()}:{port}"
    return f"http://[{host}]:{port}" if address.version == 6 else f"http://{host}:{port}"


def child_env(host: str, port: int) -> dict[str, str]:
    """The children's environment: this one's, with GANTRY_BASE_URL set to where the web
    server listens unless the operator set it (behind a proxy, the address users reach)."""
    env = dict(os.environ)
    if not env.get("GANTRY_BASE_URL"):
        env["GANTRY_BASE_URL"] = base_url(host, port)
    return env


class Command(BaseCommand):
    help = "Run the web server, a Celery worker with beat and the scheduler daemon together."

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("--host", default="127.0.0.1")
        parser.add_argument("--port", type=int, default=8000)
        parser.add_argument(
            "--grace", type=float, default=20.0, help="seconds the processes get to stop"
        )

    def handle(self, *args: Any, **options: Any) -> None:
        if options["grace"] < 0:
            raise CommandError("--grace must be 0 or more")
        from django.conf import settings

        env = child_env(options["host"], options["port"])
        started = {
            name: subprocess.Popen(argv, start_new_session=True, env=env)  # noqa: S603 - our argv
            for name, argv in commands(
                options["host"], options["port"], str(settings.VAR_DIR)
            ).items()
        }
        signals: list[int] = []

        def on_signal(signum: int, _frame: Any) -> None:
            signals.append(signum)
            if len(signals) > 1:  # asked twice: no more waiting
                self._signal_all(started, signal.SIGKILL)

        signal.signal(signal.SIGINT, on_signal)
        signal.signal(signal.SIGTERM, on_signal)
        died = self._watch(started, signals)
        self._stop(started, options["grace"])
        if died:
            raise CommandError(f"{died} exited; the others were stopped")

    def _watch(self, started: dict[str, subprocess.Popen[bytes]], signals: list[int]) -> str:
        """Until a signal arrives (""), or a child exits on its own (its name)."""
        while not signals:
            for name, process in started.items():
                if process.poll() is not None:
                    self.stderr.write(f"{name} exited with status {process.returncode}")
                    return name
            time.sleep(0.2)
        self.stdout.write(f"signal {signals[0]}: stopping the worker, scheduler and web server")
        return ""

    def _stop(self, started: dict[str, subprocess.Popen[bytes]], grace: float) -> None:
        self._signal_all(started, signal.SIGTERM)
        deadline = time.monotonic() + grace
        for name, process in started.items():
            try:
                process.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                self.stderr.write(f"{name} did not stop within {grace:g} s: killed")
                self._signal_group(process, signal.SIGKILL)
                process.wait()
        self.stdout.write("stopped")

    def _signal_all(self, started: dict[str, subprocess.Popen[bytes]], signum: int) -> None:
        for process in started.values():
            self._signal_group(process, signum)

    @staticmethod
    def _signal_group(process: subprocess.Popen[bytes], signum: int) -> None:
        if process.poll() is None:
            with contextlib.suppress(ProcessLookupError):  # gone meanwhile
                os.killpg(process.pid, signum)
