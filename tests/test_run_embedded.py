"""`make run`'s processes (`manage.py run_embedded`) on the embedded default: they start, the
scheduler completes cycles, and one SIGTERM stops them all, cleanly (issue 17, point 1: the
shell trap's `kill 0` signalled itself again and again, printing thousands of "signal 15"
lines and leaving the scheduler hanging)."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

from django.conf import settings


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def processes_with(marker: str) -> list[int]:
    """The pids of this user's processes whose environment holds `marker`."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if marker.encode() in (entry / "environ").read_bytes():
                    found.append(int(entry.name))
            except OSError:
                continue
    return found


def healthz(port: int) -> dict[str, Any]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=2) as response:
        body: dict[str, Any] = json.loads(response.read())
        return body


def test_make_runs_processes_schedule_and_stop_on_one_sigterm(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "REDIS_URL")}
    env["GANTRY_VAR_DIR"] = str(tmp_path)
    env["GANTRY_DEMO_TEST_MARKER"] = marker = f"run-embedded-{tmp_path.name}"
    base = settings.BASE_DIR
    python = sys.executable
    subprocess.run([python, "manage.py", "migrate", "-v0"], cwd=base, env=env, check=True)
    port = free_port()
    supervisor = subprocess.Popen(
        [python, "manage.py", "run_embedded", "--port", str(port), "--grace", "20"],
        cwd=base, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )  # fmt: skip
    try:
        deadline, body = time.monotonic() + 60, {}
        while time.monotonic() < deadline and body.get("scheduler") != "ok":
            time.sleep(0.5)
            try:
                body = healthz(port)
            except OSError:
                continue
        assert body.get("scheduler") == "ok", body
        assert len(processes_with(marker)) >= 4  # the supervisor and its three
        supervisor.send_signal(signal.SIGTERM)
        out, err = supervisor.communicate(timeout=40)
    finally:
        if supervisor.poll() is None:
            os.killpg(os.getpgid(supervisor.pid), signal.SIGKILL)
    errors = err.decode()
    assert supervisor.returncode == 0, errors[-2000:]
    assert "stopped" in out.decode()
    assert errors.count("signal 15") <= 1, errors[-2000:]  # the scheduler's one notice
    assert "Segmentation fault" not in errors and "killed" not in errors
    assert processes_with(marker) == []
