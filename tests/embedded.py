"""The embedded default as `make run` starts it, driven over HTTP by tests.

`Platform.start` does what the Makefile's `run` target does (migrate, seed_demo, run_embedded)
in a fresh var dir, with SQLite and the filesystem broker forced whatever the test process's
own DATABASE_URL and REDIS_URL say: it IS the embedded default. `Client` speaks to it with
urllib (an API token or a portal session with its CSRF cookie) and records every status it
saw, so that a test can assert that no request anywhere got a 5xx.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.cookiejar import CookieJar
from pathlib import Path
from typing import Any, TypeVar

from django.conf import settings

T = TypeVar("T")
DEMO_PASSWORD = "gantry-demo"  # scheduler/demo/seed.py's, as `make run` prints it
# What the embedded default must never say: SQLite's answers to writers that did not wait.
LOCK_ERRORS = ("database is locked", "database table is locked")
POLL_S = 0.25


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


def embedded_env(var_dir: Path, marker: str) -> dict[str, str]:
    """The test process's environment less what would take the platform off the embedded
    default (a database, a broker, a cluster, any Gantry or Django setting)."""
    env = {
        key: value
        for key, value in os.environ.items()
        if key not in ("DATABASE_URL", "REDIS_URL", "KUBECONFIG")
        and not key.startswith(("GANTRY_", "DJANGO_"))
    }
    env["GANTRY_VAR_DIR"] = str(var_dir)
    env["GANTRY_DEMO_TEST_MARKER"] = marker
    return env


def wait_for(what: str, probe: Callable[[], T | None], *, within_s: float) -> T:
    """Poll `probe` until it returns something other than None, for at most `within_s`."""
    deadline = time.monotonic() + within_s
    while True:
        found = probe()
        if found is not None:
            return found
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not within {within_s:g} s")
        time.sleep(POLL_S)


@dataclass
class Reply:
    status: int
    body: bytes
    headers: dict[str, str]

    def json(self) -> Any:
        return json.loads(self.body)

    @property
    def text(self) -> str:
        return self.body.decode()

    @property
    def brief(self) -> str:
        """For an assertion's message: a debug page is long, and its traceback is in the
        platform's log anyway."""
        return f"{self.status} {self.text[:800]}"


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args: Any, **kwargs: Any) -> None:
        return None  # the test reads the 302 itself


@dataclass
class Client:
    """One user agent: a cookie jar (the portal's session and CSRF cookies), an optional API
    token. Never raises on an HTTP status; every status lands in `statuses`."""

    base: str
    statuses: list[tuple[int, str, str]]
    token: str = ""
    jar: CookieJar = field(default_factory=CookieJar)

    def __post_init__(self) -> None:
        self.opener = urllib.request.build_opener(
            urllib.request.HTTPCookieProcessor(self.jar), _NoRedirect()
        )

    def request(
        self,
        method: str,
        path: str,
        *,
        json_body: Any = None,
        form: dict[str, str] | None = None,
        headers: dict[str, str] | None = None,
    ) -> Reply:
        sent = dict(headers or {})
        data = None
        if json_body is not None:
            data, sent["Content-Type"] = json.dumps(json_body).encode(), "application/json"
        elif form is not None:
            data = urllib.parse.urlencode(form).encode()
            sent["Content-Type"] = "application/x-www-form-urlencoded"
        if self.token:
            sent["Authorization"] = f"Token {self.token}"
        url = self.base + path
        request = urllib.request.Request(url, data=data, headers=sent, method=method)
        try:
            with self.opener.open(request, timeout=30) as response:
                reply = Reply(response.status, response.read(), dict(response.headers))
        except urllib.error.HTTPError as error:
            reply = Reply(error.code, error.read(), dict(error.headers))
        self.statuses.append((reply.status, method, path))
        return reply

    def get(self, path: str) -> Reply:
        return self.request("GET", path)

    def post(self, path: str, body: Any) -> Reply:
        return self.request("POST", path, json_body=body)

    def cookie(self, name: str) -> str:
        return next((c.value or "" for c in self.jar if c.name == name), "")

    def portal_post(self, path: str, form: dict[str, str]) -> Reply:
        """A form POST as the browser sends it: the CSRF cookie's token and a same-origin
        Referer (Django checks it on HTTPS only, sent anyway as a browser would)."""
        fields = {"csrfmiddlewaretoken": self.cookie("csrftoken"), **form}
        return self.request("POST", path, form=fields, headers={"Referer": self.base + path})


@dataclass
class Platform:
    """`make run`'s processes on a free port; `log` holds everything they printed."""

    base: str
    log: Path
    marker: str
    supervisor: subprocess.Popen[bytes]
    statuses: list[tuple[int, str, str]] = field(default_factory=list)
    tokens: dict[str, str] = field(default_factory=dict)

    @classmethod
    @contextlib.contextmanager
    def running(cls, var_dir: Path) -> Iterator[Platform]:
        """Started as the Makefile's `run` target starts it, on a free port, until the first
        scheduling cycle; stopped on leaving (if a test did not stop it)."""
        marker = f"embedded-{var_dir.name}-{os.getpid()}"
        env, log = embedded_env(var_dir, marker), var_dir / "platform.log"
        python, port = sys.executable, free_port()
        with log.open("ab") as out:
            for argv in (["migrate", "--noinput", "-v0"], ["seed_demo"]):
                done = subprocess.run(
                    [python, "manage.py", *argv],
                    cwd=settings.BASE_DIR, env=env, stdout=out, stderr=out, check=False,
                )  # fmt: skip
                assert done.returncode == 0, log.read_text(errors="replace")[-3000:]
            supervisor = subprocess.Popen(
                [python, "manage.py", "run_embedded", "--port", str(port), "--grace", "20"],
                cwd=settings.BASE_DIR, env=env, stdout=out, stderr=out, start_new_session=True,
            )  # fmt: skip
        platform = cls(f"http://127.0.0.1:{port}", log, marker, supervisor)
        try:
            with platform.explained():
                wait_for("the scheduler's first cycle", platform.scheduling, within_s=90)
            yield platform
        finally:
            platform.stop()

    def scheduling(self) -> bool | None:
        """True once /healthz says the scheduler completes cycles; fails at once if the
        processes have exited (one of them died: the supervisor stops the others)."""
        assert self.supervisor.poll() is None, "make run's processes exited"
        with contextlib.suppress(OSError, ValueError):
            health = Client(self.base, []).get("/healthz").json()
            return True if health.get("scheduler") == "ok" else None
        return None

    def stop(self) -> int | None:
        """One SIGTERM, as Ctrl-C in `make run`: the supervisor's exit status, None if it did
        not exit in time. Whatever is left afterwards is killed."""
        if self.supervisor.poll() is None:
            self.supervisor.send_signal(signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.supervisor.wait(timeout=40)
        status = self.supervisor.poll()
        for pid in processes_with(self.marker):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        return status

    @contextlib.contextmanager
    def explained(self) -> Iterator[None]:
        """On a failure inside, print the processes' log (pytest shows it with the failure)."""
        try:
            yield
        except BaseException:
            print(f"--- the platform's log ({self.log}), last 300 lines ---")
            print("\n".join(self.output().splitlines()[-300:]))
            raise

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def client(self) -> Client:
        return Client(self.base, self.statuses)

    def api(self, username: str) -> Client:
        """A client holding `username`'s API token (asked for once: hashing the password is
        the slowest part of a login, on purpose)."""
        client = self.client()
        if username not in self.tokens:
            login = {"username": username, "password": DEMO_PASSWORD}
            reply = client.post("/api/v1/auth/token/", login)
            assert reply.status == 200, reply.brief
            self.tokens[username] = reply.json()["token"]
        client.token = self.tokens[username]
        return client

    def portal(self, username: str) -> Client:
        """A client logged in to the portal as `username` (session and CSRF cookies)."""
        client = self.client()
        assert client.get("/accounts/login/").status == 200
        login = {"username": username, "password": DEMO_PASSWORD}
        reply = client.portal_post("/accounts/login/", login)
        assert reply.status == 302, f"login of {username}: {reply.brief}"
        return client

    def server_errors(self) -> list[tuple[int, str, str]]:
        return [seen for seen in self.statuses if seen[0] >= 500]

    def lock_errors(self) -> list[str]:
        return [line for line in self.output().splitlines() if any(e in line for e in LOCK_ERRORS)]


def approval_row(inbox_html: str, job_id: int) -> int | None:
    """The approval request's id of the portal inbox's row for the job, if listed."""
    for request_id, row in re.findall(r'<tr id="approval-(\d+)">(.*?)</tr>', inbox_html, re.S):
        if f'href="/jobs/{job_id}/"' in row:
            return int(request_id)
    return None
