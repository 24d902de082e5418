"""`make run` end to end: its processes (`manage.py run_embedded`) on the embedded default
(SQLite, the filesystem broker, the simulated cluster, the demo organisation), driven over HTTP
as its users meet it (issue 21, "The embedded default is tested too").

One platform, started as the Makefile's `run` target starts it (tests/embedded.py), serves, in
this order:
1. the journey: a member submits a job that the demo's policy sends to approvers, an approver
   approves it in the portal, the daemon admits and runs it, and the member sees its events,
   its log and its cost, then exports her costs through the Celery worker;
2. concurrent writers: members submit and approvers decide from many threads at once while the
   daemon schedules and the worker works, all writing one SQLite file: no request may get a
   5xx and no process may log SQLite's "database is locked";
3. the stop: one SIGTERM stops them all, cleanly (issue 17, point 1: the shell trap's `kill 0`
   signalled itself again and again, printing thousands of "signal 15" lines and leaving the
   scheduler hanging).
A failure prints the processes' log.

The platform forces the embedded default whatever this process's DATABASE_URL says, so the
test runs in `make test`'s SQLite pass only: the PostgreSQL pass would run the same again.
"""

from __future__ import annotations

import re
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings

from tests.embedded import Client, Platform, approval_row, processes_with, wait_for

pytestmark = pytest.mark.skipif(
    settings.DATABASES["default"]["ENGINE"] != "django.db.backends.sqlite3",
    reason="the embedded default's own run: `make test` runs it in its SQLite pass",
)
FINAL = {"succeeded", "failed", "cancelled"}
# The product team's policy in the demo sends jobs allowed over 48 hours to its approvers.
OVER_48_HOURS_S = 50 * 3600


def spec(name: str, **overrides: Any) -> dict[str, Any]:
    """A one-GPU job that the simulated cluster finishes after two seconds."""
    return {
        "name": name,
        "type": "evaluation",
        "image": "nvcr.io/nvidia/pytorch:24.05-py3",
        "command": ["python", "eval.py"],
        "replicas": 1,
        "resources": {"gpus": 1},
        "flavors": ["A100-40GB"],
        "simulation": {"duration_s": 2},
        **overrides,
    }


def project_id(client: Client, slug: str) -> int:
    reply = client.get("/api/v1/projects/?page_size=200")
    assert reply.status == 200, reply.brief
    return next(p["id"] for p in reply.json()["results"] if p["slug"] == slug)


def submit(client: Client, project: int, body: dict[str, Any], key: str = "") -> dict[str, Any]:
    headers = {"Idempotency-Key": key} if key else {}
    reply = client.request(
        "POST", "/api/v1/jobs/", json_body={"project": project, "spec": body}, headers=headers
    )
    assert reply.status in (200, 201), reply.brief
    job: dict[str, Any] = reply.json()
    return job


def finished(client: Client, job_id: int) -> dict[str, Any] | None:
    job: dict[str, Any] = client.get(f"/api/v1/jobs/{job_id}/").json()
    return job if job["state"] in FINAL else None


def export_ended(client: Client, url: str) -> dict[str, Any] | None:
    export: dict[str, Any] = client.get(url).json()
    return export if export["state"] in ("done", "failed") else None


def add_rate_card(admin: Client, flavor: str) -> None:
    """A price for the flavor from this hour on (the hour is not metered yet) high enough
    that a job of seconds costs something to see: the demo's own prices are real ones."""
    flavors = admin.get("/api/v1/flavors/").json()["results"]
    card = {
        "flavor": next(f["id"] for f in flavors if f["name"] == flavor),
        "valid_from": datetime.now(UTC).replace(minute=0, second=0, microsecond=0).isoformat(),
        "gpu_hour": "3600.00",  # a euro a second: a two-second job costs something to see
    }
    reply = admin.post("/api/v1/rate-cards/", card)
    assert reply.status == 201, reply.brief


def approve_in_portal(approver: Client, job_id: int) -> None:
    inbox = approver.get("/approvals/")
    assert inbox.status == 200
    request_id = approval_row(inbox.text, job_id)
    assert request_id is not None, f"job {job_id} is not in the approver's inbox"
    decide = f"/approvals/{request_id}/decide/"
    form = {"decision": "approve", "comment": "go ahead"}
    forged = approver.request("POST", decide, form=form)  # no CSRF token: refused
    assert forged.status == 403, forged.brief
    decided = approver.portal_post(decide, form)
    assert decided.status == 302, decided.brief


def journey(platform: Platform) -> None:
    """A member's job needing approval is approved in the portal, run, and shown to her; the
    worker writes her cost export and mails her the approval."""
    ana, admin = platform.api("ana"), platform.api("admin")
    add_rate_card(admin, "A100-40GB")
    # 1. ana submits a critical job: research's policy sends it to approvers.
    job = submit(ana, project_id(ana, "nlp-eval"), spec("journey", priority_class="critical"))
    assert job["state"] == "pending_approval", job
    assert "waiting for approval" in job["reason"]
    # 2. nils approves it in the portal, with his session and its CSRF token.
    approve_in_portal(platform.portal("nils"), job["id"])
    # 3. The daemon admits, binds and runs it; the simulated pod ends.
    done = wait_for("the job's end", lambda: finished(ana, job["id"]), within_s=40)
    assert done["state"] == "succeeded", done
    # 4. ana sees its history, its log and its cost.
    events = ana.get(f"/api/v1/jobs/{job['id']}/events/").json()["results"]
    transitions = [e for e in events if e["from_state"] != e["to_state"]]
    moves = [(e["from_state"], e["to_state"]) for e in transitions]
    assert moves == [
        ("", "pending_approval"),
        ("pending_approval", "queued"),
        ("queued", "admitted"),
        ("admitted", "binding"),
        ("binding", "running"),
        ("running", "succeeded"),
    ], moves
    approval = transitions[1]
    assert approval["actor"] == "nils" and "go ahead" in approval["message"], approval
    log = ana.get(f"/api/v1/jobs/{job['id']}/logs/").json()
    assert log["done"] and log["lines"][-1]["text"] == "exit code 0", log
    page = platform.portal("ana").get(f"/jobs/{job['id']}/")
    assert page.status == 200 and "Approved by nils" in page.text
    cost = re.search(r'id="job-cost-total">([\d.]+)<', page.text)
    assert cost and Decimal(cost.group(1)) > 0, "the job page shows no cost"
    # 5. The worker (Celery on the filesystem broker) writes her cost export and mails her
    # the approval.
    export = ana.post("/api/v1/cost-exports/", {"format": "csv"})
    assert export.status == 201, export.brief
    url = f"/api/v1/cost-exports/{export.json()['id']}/"
    written = wait_for("the worker's export", lambda: export_ended(ana, url), within_s=30)
    assert written["state"] == "done", written
    download = ana.get(written["download"])
    header = download.text.splitlines()[0]
    assert download.status == 200 and "charged_EUR" in header, download.brief
    mail = f"[Gantry] job journey (#{job['id']}): approved"
    wait_for("the approval's email", lambda: mail in platform.output() or None, within_s=30)
    # Its link is the port `make run` serves on (a free one here), not the settings' default.
    assert f"See it at {platform.base}/jobs/{job['id']}/" in platform.output()
    assert platform.server_errors() == []


# submitter, project, approvers racing to decide each of the submitter's requests, the spec's
# part that sends it to them (research's policy: critical; product's: over 48 hours)
BURST = [
    ("ana", "nlp-eval", ("nils", "nora"), {"priority_class": "critical"}),
    ("vik", "detector", ("vera", "rita"), {"priority_class": "critical"}),
    ("sam", "ranker", ("paul", "paul"), {"max_runtime_s": OVER_48_HOURS_S}),
]
PER_SUBMITTER = 3  # needing approval, and as many that queue at once
NAMES = sorted({name for name, _, pair, _ in BURST for name in (name, *pair)})


def concurrent_writers(platform: Platform) -> None:
    """Members submit and approvers decide from many threads at once while the daemon
    schedules: no 5xx, no "database is locked", every job run to its end."""
    with ThreadPoolExecutor(max_workers=8) as pool:  # logins hash passwords: slow on purpose
        users = dict(zip(NAMES, pool.map(platform.api, NAMES), strict=True))
    members = {name: users[name] for name, *_ in BURST}
    deciders = {approver: users[approver] for _, _, pair, _ in BURST for approver in pair}
    projects = {name: project_id(members[name], slug) for name, slug, *_ in BURST}
    tasks = [
        (name, f"burst-{name}-{n}", gate if n % 2 == 0 else {})
        for name, _, _, gate in BURST
        for n in range(2 * PER_SUBMITTER)
    ]

    def submit_one(task: tuple[str, str, dict[str, Any]]) -> dict[str, Any]:
        name, job_name, gate = task
        return submit(members[name], projects[name], spec(job_name, **gate))

    # 1. Every member submits at once: half wait for approval, half queue for the daemon;
    # two of the requests carry the same Idempotency-Key.
    twin = (members["ana"], projects["ana"], spec("burst-twin"))
    with ThreadPoolExecutor(max_workers=8) as pool:
        jobs = list(pool.map(submit_one, tasks))
        twins = list(pool.map(lambda _: submit(*twin, key="burst-twin"), range(2)))
    assert twins[0]["id"] == twins[1]["id"], "one Idempotency-Key made two jobs"
    gated = [job for job, (_, _, gate) in zip(jobs, tasks, strict=True) if gate]
    assert {job["state"] for job in gated} == {"pending_approval"}, gated

    # 2. Two approvers decide each request at the same moment: exactly one of them wins,
    # the other is told it is decided (409).
    pairs = [
        (deciders[approver], job["id"])
        for job in gated
        for approver in next(pair for who, _, pair, _ in BURST if who == job["submitted_by"])
    ]
    with ThreadPoolExecutor(max_workers=8) as pool:
        decisions = [
            (approver, request_id)
            for (approver, _), request_id in zip(
                pairs, pool.map(lambda p: request_of(*p), pairs), strict=True
            )
        ]
        answers = list(pool.map(lambda d: approve(*d), decisions))
    by_request: dict[int, list[int]] = {}
    for (_, request_id), status in zip(decisions, answers, strict=True):
        by_request.setdefault(request_id, []).append(status)
    assert all(sorted(s) == [200, 409] for s in by_request.values()), by_request

    # 3. The daemon runs them all to their end.
    for job in [*jobs, twins[0]]:
        owner = members[job["submitted_by"]]
        done = wait_for(
            f"job {job['id']}'s end", lambda j=job, c=owner: finished(c, j["id"]), within_s=60
        )
        assert done["state"] == "succeeded", done
    assert platform.server_errors() == []
    assert platform.lock_errors() == []
    assert "Internal Server Error" not in platform.output()


def request_of(approver: Client, job_id: int) -> int:
    """The id of the job's pending approval request in the approver's inbox."""
    inbox = approver.get(f"/api/v1/approval-requests/inbox/?subject_id={job_id}&kind=job")
    assert inbox.status == 200, inbox.brief
    rows = inbox.json()["results"]
    assert len(rows) == 1, rows
    request_id: int = rows[0]["id"]
    return request_id


def approve(approver: Client, request_id: int) -> int:
    return approver.post(f"/api/v1/approval-requests/{request_id}/approve/", {}).status


def stops_on_one_sigterm(platform: Platform) -> None:
    assert platform.scheduling(), "the scheduler completes no cycles"
    assert len(processes_with(platform.marker)) >= 4  # the supervisor and its three
    status = platform.stop()
    output = platform.output()
    assert status == 0, output[-2000:]
    assert "stopped" in output
    # One notice from the supervisor, one from the scheduler: not one per trap re-run.
    assert output.count("signal 15") <= 2, output[-2000:]
    assert "Segmentation fault" not in output and "killed" not in output
    assert processes_with(platform.marker) == []


def test_make_run_serves_a_journey_and_concurrent_writers_then_stops_on_one_sigterm(
    tmp_path: Path,
) -> None:
    """One test, so that one platform serves it all (pytest-xdist would hand separate tests
    to separate workers, each starting its own)."""
    with Platform.running(tmp_path) as platform, platform.explained():
        journey(platform)
        concurrent_writers(platform)
        stops_on_one_sigterm(platform)
