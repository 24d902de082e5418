"""`manage.py run_webhook`: starts serving over TLS, answers, and stops on SIGTERM."""

from __future__ import annotations

import http.client
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from django.core.management import CommandError, call_command

from devcluster.plane import free_port
from tests.workloads.tls import ServingPair, serving_pair

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> ServingPair:
    return serving_pair(tmp_path_factory.mktemp("webhook-pki"))


@pytest.mark.backend_independent("a subprocess serving TLS; no database")
def test_serves_healthz_over_tls_and_stops_on_sigterm(pair: ServingPair) -> None:
    port = free_port()
    command = [sys.executable, "manage.py", "run_webhook", "--host", "127.0.0.1"]
    command += ["--port", str(port), "--cert", str(pair.cert), "--key", str(pair.key)]
    process = subprocess.Popen(
        command, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=os.environ.copy()
    )
    try:
        assert process.stdout is not None
        line = process.stdout.readline().decode()  # printed once it listens
        assert line.strip() == f"webhook: serving https://127.0.0.1:{port}/mutate", line
        conn = http.client.HTTPSConnection(
            "127.0.0.1", port, context=pair.client_context(), timeout=30
        )
        conn.request("GET", "/healthz")
        assert conn.getresponse().read() == b"ok"
        conn.close()
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=30) == 0
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
        for stream in (process.stdout, process.stderr):
            if stream is not None:
                stream.close()


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (["--port", "0"], "--port must be a port number"),
        (["--cert", "/nonexistent.pem"], "no such file: /nonexistent.pem"),
    ],
)
def test_bad_arguments_say_what_is_wrong(pair: ServingPair, args: list[str], said: str) -> None:
    options = {"--port": "9443", "--cert": str(pair.cert), "--key": str(pair.key)}
    for flag, value in zip(args[::2], args[1::2], strict=True):
        options[flag] = value
    argv = [part for item in options.items() for part in item]
    with pytest.raises(CommandError, match=said):
        call_command("run_webhook", *argv)


def test_a_port_taken_is_a_clear_error(pair: ServingPair) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        argv = [
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--cert",
            str(pair.cert),
            "--key",
            str(pair.key),
        ]
        with pytest.raises(CommandError, match=f"cannot serve on 127.0.0.1:{port}"):
            call_command("run_webhook", *argv)
