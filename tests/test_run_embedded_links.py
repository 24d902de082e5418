"""`make run PORT=...` mails links to the port it serves on (issue 35, "Smaller things"):
`run_embedded` hands its children GANTRY_BASE_URL from its --host and --port unless the
operator set one. The whole platform's email is checked end to end in
tests/test_run_embedded.py's journey."""

from __future__ import annotations

import socket
import subprocess
from typing import Any

import pytest
from django.core.management import call_command

from common.management.commands import run_embedded


@pytest.mark.parametrize(
    ("host", "port", "expected"),
    [
        ("127.0.0.1", 8104, "http://127.0.0.1:8104"),
        ("localhost", 9000, "http://localhost:9000"),
        ("::1", 8104, "http://[::1]:8104"),
        ("0.0.0.0", 8104, f"http://{socket.getfqdn()}:8104"),
    ],
    ids=["loopback", "a-name", "ipv6-bracketed", "wildcard-is-the-machine"],
)
def test_base_url_is_where_the_web_server_listens(host: str, port: int, expected: str) -> None:
    assert run_embedded.base_url(host, port) == expected


def test_children_get_the_served_address_unless_the_operator_set_one(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("GANTRY_BASE_URL", raising=False)
    assert run_embedded.child_env("127.0.0.1", 8104)["GANTRY_BASE_URL"] == "http://127.0.0.1:8104"
    monkeypatch.setenv("GANTRY_BASE_URL", "https://gantry.example.com")
    kept = run_embedded.child_env("127.0.0.1", 8104)["GANTRY_BASE_URL"]
    assert kept == "https://gantry.example.com"


def test_every_child_is_started_with_it(monkeypatch: pytest.MonkeyPatch) -> None:
    """The worker (approval emails), the daemon (job events) and the web server (requests
    that write notifications) all build links: each is started with the address."""
    monkeypatch.delenv("GANTRY_BASE_URL", raising=False)
    seen: dict[str, str] = {}

    class Exited:
        returncode = 0

        def __init__(self, argv: list[str], **kwargs: Any) -> None:
            seen[argv[2] if argv[1] == "manage.py" else "worker"] = kwargs["env"]["GANTRY_BASE_URL"]
            self.pid = 0

        def poll(self) -> int:
            return 0  # exited at once: the command stops the others and reports it

        def wait(self, timeout: float | None = None) -> int:
            return 0

    monkeypatch.setattr(subprocess, "Popen", Exited)
    monkeypatch.setattr(run_embedded.signal, "signal", lambda *_: None)  # pytest keeps its own
    with pytest.raises(Exception, match="exited"):
        call_command("run_embedded", "--port", "8123", "--grace", "0")
    assert seen == dict.fromkeys(["worker", "run_scheduler", "runserver"], "http://127.0.0.1:8123")
