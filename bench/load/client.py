"""The load benchmark's virtual users: a plain asyncio client (aiohttp), run as its own process
so that its CPU is measured apart from the product's.

    python -m bench.load.client PLAN.json OUT.json

PLAN is what bench.load writes: the base URL, the people (username, token, role, team,
projects), the number of virtual users, the measured window, the think time, the seed and the
database URL (the window's start resets pg_stat_statements there). Each virtual user is one
person: it logs in to the portal (the warm-up, not measured), waits for the others, then
until the window ends thinks, then picks an action weighted by its role and makes its requests.
Latencies are kept per route template (`GET /api/v1/jobs/{id}/`), never per raw URL.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import re
import resource
import sys
import time
import uuid
from collections import Counter, defaultdict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

from bench.load.env import cpu_seconds

STATES = ("queued", "running", "succeeded", "failed", "pending_approval", "cancelled")
# Answers that are the product doing its job, not errors: a request decided by another
# approver a moment earlier, a job that finished before its cancel.
EXPECTED = {
    "GET /api/v1/jobs/": {404},  # a page past the last of a narrow filter
    "POST /api/v1/approval-requests/{id}/approve/": {409},
    "POST /approvals/{id}/decide/": {409},
}
TIMELINE_S = 10
SLOW_MS = 1000.0
CSRF = re.compile(r'name="csrfmiddlewaretoken" value="([^"]+)"')


@dataclass
class Stats:
    latencies: dict[str, list[float]] = field(default_factory=lambda: defaultdict(list))
    statuses: dict[str, Counter[int]] = field(default_factory=lambda: defaultdict(Counter))
    errors: list[dict[str, Any]] = field(default_factory=list)
    counts: Counter[str] = field(default_factory=Counter)
    recording: bool = False
    # Per GET route, one request as a user made it: replayed alone after the window.
    samples: dict[str, tuple[Any, str, dict[str, Any]]] = field(default_factory=dict)
    # Per TIMELINE_S of the window (by when a request ended): [requests, over 1 s, max ms],
    # to tell a tail spread over the run from bursts in which every route waits.
    timeline: dict[int, list[float]] = field(default_factory=dict)
    window_started: float = 0.0

    def record(self, route: str, status: int, ms: float, body: str) -> None:
        if not self.recording:  # the logins before the window, the replay after it
            self.counts[f"warmup {route} {status}"] += 1
            return
        self.latencies[route].append(ms)
        self.statuses[route][status] += 1
        second = int((time.monotonic() - self.window_started) // TIMELINE_S * TIMELINE_S)
        bucket = self.timeline.setdefault(second, [0, 0, 0.0])
        bucket[0] += 1
        bucket[1] += ms > SLOW_MS
        bucket[2] = max(bucket[2], ms)
        if status >= 400 and status not in EXPECTED.get(route, ()):
            self.counts["errors"] += 1
            if len(self.errors) < 50:
                self.errors.append({"route": route, "status": status, "body": body[:300]})


@dataclass
class User:
    person: dict[str, Any]
    session: aiohttp.ClientSession  # the portal's: a browser, with its cookies
    api: aiohttp.ClientSession  # the API's: a script with a token and no cookies
    stats: Stats
    rng: random.Random
    jobs: list[int] = field(default_factory=list)
    submitted: int = 0

    async def call(
        self, method: str, route: str, url: str, *, api: bool = True, **kwargs: Any
    ) -> tuple[int, Any]:
        headers = kwargs.pop("headers", {})
        if api:
            headers["Authorization"] = f"Token {self.person['token']}"
        session = self.api if api else self.session
        started = time.perf_counter()
        try:
            async with session.request(
                method, url, headers=headers, allow_redirects=False, **kwargs
            ) as response:
                text = await response.text()
                status = response.status
        except (aiohttp.ClientError, TimeoutError) as exc:
            text, status = f"{type(exc).__name__}: {exc}", 599
        self.stats.record(route, status, (time.perf_counter() - started) * 1000, text)
        if method == "GET" and status < 300 and route not in self.stats.samples:
            self.stats.samples[route] = (self, url, {"api": api, "headers": headers, **kwargs})
        if status < 300 and text.startswith(("{", "[")):
            return status, json.loads(text)
        return status, text

    def a_job(self) -> int | None:
        return self.rng.choice(self.jobs) if self.jobs else None

    def learn(self, body: Any) -> None:
        if isinstance(body, dict):
            ids = [r["id"] for r in body.get("results", []) if isinstance(r, dict) and "id" in r]
            self.jobs = (self.jobs + ids)[-100:]


# --- the actions ---------------------------------------------------------------------------


async def api_jobs_list(u: User) -> None:
    params: dict[str, Any] = {"page": u.rng.choice((1, 1, 1, 2, 3, 5))}
    pick = u.rng.random()
    if pick < 0.3:
        params["state"] = u.rng.choice(STATES)
    elif pick < 0.5 and u.person["projects"]:
        params["project"] = u.rng.choice(u.person["projects"])
    elif pick < 0.65:
        params["name"] = u.rng.choice(("llama", "eval", "sweep", "load-"))
        params["page"] = 1
    _, body = await u.call("GET", "GET /api/v1/jobs/", "/api/v1/jobs/", params=params)
    u.learn(body)


async def api_job(u: User) -> None:
    if (job := u.a_job()) is None:
        return await api_jobs_list(u)
    await u.call("GET", "GET /api/v1/jobs/{id}/", f"/api/v1/jobs/{job}/")
    if u.rng.random() < 0.5:
        await u.call("GET", "GET /api/v1/jobs/{id}/events/", f"/api/v1/jobs/{job}/events/")
    if u.rng.random() < 0.4:
        await u.call("GET", "GET /api/v1/jobs/{id}/queue/", f"/api/v1/jobs/{job}/queue/")


async def api_queue(u: User) -> None:
    await u.call("GET", "GET /api/v1/queue/", "/api/v1/queue/")


async def portal_jobs(u: User) -> None:
    params: dict[str, Any] = {}
    if u.rng.random() < 0.4:
        params["state"] = u.rng.choice(STATES)
    if u.rng.random() < 0.3:
        params["mine"] = "on"
    await u.call("GET", "GET /jobs/", "/jobs/", api=False, params=params)
    # The list polls its rows while it is open.
    for _ in range(u.rng.randint(1, 3)):
        params["page"] = u.rng.choice((1, 1, 2))
        await u.call(
            "GET", "GET /jobs/rows/", "/jobs/rows/", api=False, params=params,
            headers={"HX-Request": "true"},
        )  # fmt: skip


async def portal_job(u: User) -> None:
    if (job := u.a_job()) is None:
        return await api_jobs_list(u)
    await u.call("GET", "GET /jobs/{id}/", f"/jobs/{job}/", api=False)
    for _ in range(u.rng.randint(1, 3)):  # the status partial, polled
        await u.call(
            "GET", "GET /jobs/{id}/status/", f"/jobs/{job}/status/", api=False,
            headers={"HX-Request": "true"},
        )  # fmt: skip
    # The page offers the logs panel to the tenant's members, not to finance (a 404 there).
    if u.rng.random() < 0.2 and u.person["role"] != "finance":
        await u.call(
            "GET", "GET /jobs/{id}/logs/", f"/jobs/{job}/logs/", api=False,
            headers={"HX-Request": "true"},
        )  # fmt: skip


async def portal_home(u: User) -> None:
    await u.call("GET", "GET /", "/", api=False)


async def team_dashboard(u: User) -> None:
    tenant = u.person["tenant"]
    if tenant:
        await u.call(
            "GET", "GET /tenants/{id}/dashboard/", f"/tenants/{tenant}/dashboard/", api=False
        )


def _spec(u: User) -> dict[str, Any]:
    big = u.rng.random() < 0.15
    team = u.person["team"]
    replicas, gpus = (
        (3, 8) if big and team == "nlp" else (1, 8) if big else (1, u.rng.choice((1, 1, 2, 4)))
    )
    u.submitted += 1
    return {
        "name": f"load-{u.person['username']}-{u.submitted}",
        "type": u.rng.choice(("training", "batch", "evaluation", "fine-tuning")),
        "image": "nvcr.io/nvidia/pytorch:24.05-py3",
        "command": ["python", "-m", "train"],
        "replicas": replicas,
        "resources": {"gpus": gpus, "cpu_milli": 2000 * gpus, "memory_mib": 8192 * gpus},
        "simulation": {"duration_s": u.rng.randint(20, 240)},
    }


async def submit(u: User, results: dict[str, Any]) -> None:
    if not u.person["projects"]:
        return await api_jobs_list(u)
    key = f"load-{uuid.UUID(int=u.rng.getrandbits(128))}"
    body = {"project": u.rng.choice(u.person["projects"]), "spec": _spec(u)}
    route = "POST /api/v1/jobs/"
    status, job = await u.call(
        "POST", route, "/api/v1/jobs/", json=body, headers={"Idempotency-Key": key}
    )
    if status != 201:
        return
    results["keys"].append([u.person["username"], key])
    u.jobs.append(job["id"])
    if u.rng.random() < 0.2:  # the client did not see the answer and sends it again
        again, repeat = await u.call(
            "POST", "POST /api/v1/jobs/ (retry)", "/api/v1/jobs/", json=body,
            headers={"Idempotency-Key": key},
        )  # fmt: skip
        results["retries"] += 1
        if again != 200 or not isinstance(repeat, dict) or repeat.get("id") != job["id"]:
            results["duplicates"] += 1


async def approve_api(u: User) -> None:
    route = "GET /api/v1/approval-requests/inbox/"
    _, inbox = await u.call("GET", route, "/api/v1/approval-requests/inbox/")
    pending = (
        [r for r in (inbox or {}).get("results", []) if r.get("state") == "pending"]
        if isinstance(inbox, dict)
        else []
    )
    if pending:
        pk = u.rng.choice(pending)["id"]
        verb = "approve" if u.rng.random() < 0.85 else "reject"
        await u.call(
            "POST", f"POST /api/v1/approval-requests/{{id}}/{verb}/",
            f"/api/v1/approval-requests/{pk}/{verb}/", json={"comment": "load bench"},
        )  # fmt: skip


async def approve_portal(u: User) -> None:
    _, page = await u.call("GET", "GET /approvals/", "/approvals/", api=False)
    if not isinstance(page, str):
        return
    pending = re.findall(r"/approvals/(\d+)/decide/", page)
    token = CSRF.search(page)
    if pending and token:
        pk = u.rng.choice(pending)
        await u.call(
            "POST", "POST /approvals/{id}/decide/", f"/approvals/{pk}/decide/", api=False,
            data={"csrfmiddlewaretoken": token.group(1), "decision": "approve", "comment": "ok"},
            headers={"HX-Request": "true"},
        )  # fmt: skip


async def costs(u: User) -> None:
    pick = u.rng.random()
    if pick < 0.4:
        by = u.rng.choice(("team", "project", "user", "flavor"))
        await u.call("GET", "GET /api/v1/costs/", "/api/v1/costs/", params={"by": by})
    elif pick < 0.7:
        await u.call("GET", "GET /costs/", "/costs/", api=False)
    elif u.person["role"] == "finance":  # the cluster's dashboard is not a tenant's data
        await u.call("GET", "GET /dashboards/cluster/", "/dashboards/cluster/", api=False)
    else:
        await team_dashboard(u)


def actions(
    role: str, results: dict[str, Any]
) -> list[tuple[Callable[[User], Awaitable[None]], int]]:
    """What a person of this role does, with weights: mostly following jobs, some submitting;
    approvers decide, admins and finance read costs."""
    out: list[tuple[Callable[[User], Awaitable[None]], int]] = [
        (api_jobs_list, 20),
        (api_job, 18),
        (portal_jobs, 14),
        (portal_job, 14),
        (portal_home, 5),
        (api_queue, 3),
        (team_dashboard, 3),
        (lambda u: submit(u, results), 10),
    ]
    if role == "approver":
        out += [(approve_api, 10), (approve_portal, 10)]
    if role in ("admin", "finance"):
        out += [(costs, 20)]
    return out


# --- the run ------------------------------------------------------------------------------


async def login(u: User, gate: asyncio.Semaphore, form: bool) -> bool:
    """Sign in to the portal through the form (`form`), a few at a time (each login hashes the
    password, seconds of CPU on a busy host, and a crowd of them would time out), trying again
    after a failure; or take up the session the seed signed in, and the CSRF cookie a page
    sets (every page carries one, for its sign-out form)."""
    if not form:
        u.session.cookie_jar.update_cookies({"sessionid": u.person["session"]})
        status, _ = await u.call("GET", "GET /", "/", api=False)
        return status == 200
    async with gate:
        for _ in range(5):
            if await _login(u):
                return True
            await asyncio.sleep(1)
    return False


async def _login(u: User) -> bool:
    status, page = await u.call("GET", "GET /accounts/login/", "/accounts/login/", api=False)
    token = CSRF.search(page) if isinstance(page, str) else None
    if token is None:
        return False
    status, _ = await u.call(
        "POST", "POST /accounts/login/", "/accounts/login/", api=False,
        data={"csrfmiddlewaretoken": token.group(1), "username": u.person["username"],
              "password": u.person["password"]},
    )  # fmt: skip
    return status == 302


async def run(plan: dict[str, Any]) -> dict[str, Any]:
    stats = Stats()
    results: dict[str, Any] = {"keys": [], "retries": 0, "duplicates": 0}
    rng = random.Random(plan["seed"])
    people = plan["people"][: plan["users"]]
    timeout = aiohttp.ClientTimeout(total=60)
    users = [
        User(
            person=p,
            session=aiohttp.ClientSession(
                plan["base_url"], timeout=timeout, cookie_jar=aiohttp.CookieJar(unsafe=True)
            ),
            api=aiohttp.ClientSession(
                plan["base_url"], timeout=timeout, cookie_jar=aiohttp.DummyCookieJar()
            ),
            stats=stats,
            rng=random.Random(rng.getrandbits(64)),
        )
        for p in people
    ]
    ready = asyncio.Event()
    window: dict[str, Any] = {}
    tried: list[bool] = []
    gate = asyncio.Semaphore(4)

    async def one(index: int, u: User) -> None:
        await asyncio.sleep(u.rng.uniform(0, plan["ramp_s"]))
        logged_in = False
        try:
            logged_in = await login(u, gate, form=index < plan["form_logins"])
        finally:
            tried.append(logged_in)
        await ready.wait()
        if not logged_in:
            stats.counts["login failed"] += 1
            return
        choices = actions(u.person["role"], results)
        weights = [w for _, w in choices]
        # Each user thinks before each action, the first included: users in the middle of
        # their sessions arrive spread out, where acting first sent every user's first request
        # in the window's first second (a burst no real crowd makes: every request of the
        # first 10 s waited seconds, and then none did).
        while True:
            think = min(u.rng.expovariate(1 / plan["think_s"]), plan["think_s"] * 5)
            await asyncio.sleep(max(0.0, min(think, window["end"] - time.monotonic())))
            if time.monotonic() >= window["end"]:
                break
            action = u.rng.choices([a for a, _ in choices], weights)[0]
            await action(u)

    try:
        tasks = [asyncio.create_task(one(n, u)) for n, u in enumerate(users)]
        while len(tried) < len(users):
            await asyncio.sleep(0.1)
        window.update(await start_window(plan))
        stats.window_started = time.monotonic()
        stats.recording = True
        ready.set()
        await asyncio.gather(*tasks)
        window["stopped"] = time.monotonic()
        stats.recording = False
        server = cpu_seconds(plan["cpu_groups"], plan["postmaster"])
        solo = await replay_alone(stats, plan)
    finally:
        for u in users:
            await u.session.close()
            await u.api.close()
    wall = window["stopped"] - window["started"]
    cpu = _cpu_s() - window["cpu"]
    return {
        "solo": solo,
        "wall_s": wall,
        "client_cpu_s": cpu,
        "client_cpu_share": cpu / wall / (os.cpu_count() or 1) if wall else 0.0,
        "server_cpu_s": {k: v - window["server_cpu"].get(k, 0.0) for k, v in server.items()},
        "loadavg_start": window["loadavg"],
        "statements_reset": window["statements_reset"],
        "loadavg_end": Path("/proc/loadavg").read_text().split()[:3],
        "latencies": stats.latencies,
        "timeline": [
            {"from_s": at, "requests": int(n), "over_1s": int(slow), "max_ms": round(top, 1)}
            for at, (n, slow, top) in sorted(stats.timeline.items())
        ],
        "statuses": {r: dict(c) for r, c in stats.statuses.items()},
        "errors": stats.errors,
        "error_count": stats.counts["errors"],
        "login_failed": stats.counts["login failed"],
        "warmup": {
            k.removeprefix("warmup "): v for k, v in stats.counts.items() if k.startswith("warmup ")
        },
        "idempotency": results,
    }


async def replay_alone(stats: Stats, plan: dict[str, Any], times: int = 3) -> dict[str, Any]:
    """Each GET route's sample request made `times` times in a row, nothing else running of
    ours: the median wall time, and the web processes' mean CPU per request (their CPU over the
    requests, from /proc: what the route costs the server, however busy the host is)."""
    out = {}
    for route, (user, url, kwargs) in sorted(stats.samples.items()):
        walls, cpus = [], []
        for _ in range(times):
            before = cpu_seconds({"web": plan["cpu_groups"]["web"]}, None)["web"]
            started = time.perf_counter()
            await user.call("GET", route, url, **{**kwargs, "headers": dict(kwargs["headers"])})
            walls.append((time.perf_counter() - started) * 1000)
            cpus.append(
                (cpu_seconds({"web": plan["cpu_groups"]["web"]}, None)["web"] - before) * 1000
            )
        out[route] = {
            "wall_ms": round(sorted(walls)[times // 2], 1),
            "web_cpu_ms": round(sum(cpus) / times, 1),
        }
    return out


async def start_window(plan: dict[str, Any]) -> dict[str, Any]:
    """The measured window starts now: PostgreSQL's statement statistics start from zero."""
    import psycopg

    reset = True
    try:
        async with await psycopg.AsyncConnection.connect(
            plan["database_url"], autocommit=True
        ) as conn:
            await conn.execute("SELECT pg_stat_statements_reset()")
    except psycopg.Error:  # the server does not load the extension: no statements reported
        reset = False
    now = time.monotonic()
    return {
        "server_cpu": cpu_seconds(plan["cpu_groups"], plan["postmaster"]),
        "statements_reset": reset,
        "started": now,
        "end": now + plan["duration_s"],
        "cpu": _cpu_s(),
        "loadavg": Path("/proc/loadavg").read_text().split()[:3],
    }


def _cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def main(argv: list[str]) -> int:
    plan = json.loads(Path(argv[0]).read_text())
    out = asyncio.run(run(plan))
    Path(argv[1]).write_text(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
