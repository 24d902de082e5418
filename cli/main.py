"""`gantry` command line: log in, submit jobs from a YAML or JSON spec, follow and cancel them.

Exit codes: 0 success, 1 the server refused (4xx/5xx, message printed), 2 bad usage or input,
3 the server could not be reached, 4 a dry run whose quote says a submit would be refused
(the quote and why are printed; nothing was submitted), so that `submit --dry-run && submit`
stops there.
"""

from __future__ import annotations

import argparse
import getpass
import json
import os
import sys
import textwrap
import uuid
from collections.abc import Sequence
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any, TextIO

import yaml

from cli import capacity, cluster, clusters, logs, quota_requests, rate_cards, what_ifs, when
from cli.client import ApiError, Client, ConnectionFailed
from cli.files import load_yaml
from cli.usage import UsageError

DEFAULT_URL = "http://127.0.0.1:8000"
WOULD_BE_REFUSED = 4  # the exit code of a dry run a submit would be refused for


class WouldBeRefused(Exception):
    """A dry run's quote says a submit would be refused (the quote itself is printed)."""


def config_path() -> Path:
    base = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(os.environ.get("GANTRY_CONFIG", Path(base) / "gantry" / "config.json"))


def load_config() -> dict[str, str]:
    path = config_path()
    stored = json.loads(path.read_text()) if path.exists() else {}
    url = os.environ.get("GANTRY_URL") or stored.get("url") or DEFAULT_URL
    token = os.environ.get("GANTRY_TOKEN") or stored.get("token") or ""
    return {"url": url, "token": token}


def save_config(url: str, token: str) -> Path:
    path = config_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"url": url, "token": token}))
    path.chmod(0o600)  # the token is a credential
    return path


def client_version() -> str:
    """The installed Gantry's version (the CLI imports no server package, so it does not use
    common.releases.version: the same lookup, kept twice)."""
    try:
        return version("gantry")
    except PackageNotFoundError:
        return "unknown"


# --- output -------------------------------------------------------------------------------


def table(rows: Sequence[dict[str, Any]], columns: Sequence[str], out: TextIO) -> None:
    if not rows:
        out.write("(none)\n")
        return
    cells = [[_cell(row.get(col)) for col in columns] for row in rows]
    widths = [max(len(col), *(len(r[i]) for r in cells)) for i, col in enumerate(columns)]
    out.write("  ".join(c.upper().ljust(w) for c, w in zip(columns, widths, strict=True)) + "\n")
    for r in cells:
        out.write("  ".join(v.ljust(w) for v, w in zip(r, widths, strict=True)).rstrip() + "\n")


def _printable(value: Any) -> str:
    # Never let a server value move the terminal cursor or change colours.
    text = "" if value is None else str(value)
    return "".join(ch if ch.isprintable() else "?" for ch in text)


def _cell(value: Any) -> str:
    return _printable(value)[:60]


def emit(args: argparse.Namespace, data: Any, columns: Sequence[str] | None, out: TextIO) -> None:
    if args.json or columns is None:
        out.write(json.dumps(data, indent=2, sort_keys=True) + "\n")
    elif isinstance(data, list):
        table(data, columns, out)
    else:
        for col in columns:
            out.write(f"{col:>14}: {_cell(data.get(col))}\n")


# --- commands -----------------------------------------------------------------------------

JOB_COLUMNS = [
    "id",
    "name",
    "job_type",
    "state",
    "project_slug",
    "submitted_by",
    "priority_class",
    "gpus_total",
    "reason",
]


def cmd_login(args: argparse.Namespace, client: Client, out: TextIO) -> None:
    password = os.environ.get("GANTRY_PASSWORD") or getpass.getpass("Password: ")
    url = args.url or client.url
    anonymous = Client(url=url, retries=client.retries)
    answer = anonymous.post(
        "/api/v1/auth/token/", {"username": args.username, "password": password}
    )
    path = save_config(url, answer["token"])
    out.write(f"Logged in to {url} as {args.username}; token saved in {path}\n")
    if isinstance(answer.get("expires"), str):
        out.write(f"The token expires {answer['expires']} (`gantry rotate-token` renews it)\n")


def cmd_rotate_token(args: argparse.Namespace, client: Client, out: TextIO) -> None:
    """A fresh token (a full lifetime) in place of the saved one, which stops working."""
    answer = client.post("/api/v1/auth/token/rotate/")
    path = save_config(client.url, answer["token"])
    out.write(f"New token saved in {path}; it expires {answer['expires']}\n")


def cmd_whoami(args: argparse.Namespace, client: Client, out: TextIO) -> None:
    emit(args, client.get("/api/v1/me/"), ["username", "platform_roles"], out)


def cmd_projects(args: argparse.Namespace, client: Client, out: TextIO) -> None:
    rows = list(client.pages("/api/v1/projects/"))
    emit(args, rows, ["id", "slug", "name", "namespace", "tenant"], out)


def cmd_quotas(args: argparse.Namespace, client: Client, out: TextIO) -> None:
    rows = list(client.pages("/api/v1/quotas/", tenant=args.tenant))
    for row in rows:
        row["guaranteed"] = row["guaranteed_milli"] / 1000
        row["limit"] = row["limit_milli"] / 1000
        row["cluster"] = row.get("cluster_name") or "(all)"  # a pinned quota names its cluster
    emit(
        args, rows, ["tenant_slug", "flavor_name", "cluster", "guaranteed", "limit", "weight"], out
    )


def read_spec(path: str) -> dict[str, Any]:
    try:
        text = sys.stdin.read() if path == "-" else Path(path).read_text()
        spec = load_yaml(text)
    except (OSError, yaml.YAMLError) as exc:
        raise UsageError(f"cannot read the spec {path}: {exc}") from None
    if not isinstance(spec, dict):
        raise UsageError(f"the spec {path} must be a mapping of fields, e.g. name: ..., type: ...")
    return spec


def resolve_project(client: Client, project: str) -> int:
    if project.isdigit():
        return int(project)
    matches = [p for p in client.pages("/api/v1/projects/") if p["slug"] == project]
    if len(matches) != 1:
        raise UsageError(f"no single project with slug {project!r}; see `gantry projects`.")
    return int(matches[0]["id"])


def _money(currency: str, value: str | None) -> str:
    return "unbounded (no maximum runtime)" if value is None else f"{currency} {value}"


def print_quote(quote: dict[str, Any], out: TextIO) -> None:
    """The quote in a few lines: cost range, approval and why, budget left."""
    job, estimate = quote["job"], quote["estimate"]
    currency = _cell(estimate["currency"])
    out.write(f"Quote for {_cell(job['name'])} (dry run: nothing was submitted)\n")
    low, high = _money(currency, estimate["low"]), _money(currency, estimate["high"])
    out.write(f"{'cost':>14}: {_cell(low)} to {_cell(high)}\n")
    per_hour = f"{estimate['per_hour_low']} to {estimate['per_hour_high']}"
    out.write(f"{'per hour':>14}: {currency} {_cell(per_hour)}\n")
    if estimate["unpriced_flavors"]:
        unpriced = ", ".join(estimate["unpriced_flavors"])
        out.write(f"{'no rate for':>14}: {_cell(unpriced)}\n")
    refused = quote.get("refused")
    if refused:
        out.write(f"{'submit':>14}: would be REFUSED\n")
        for line in textwrap.wrap(_printable(refused["reason"]), width=72):  # whole: its figures
            out.write(f"{'':>14}  {line}\n")
        out.write(f"{'approval':>14}: not judged (a submit stops at the refusal)\n")
    else:
        approval = quote["approval"]
        out.write(f"{'approval':>14}: {'needed' if approval['needed'] else 'not needed'}\n")
        for reason in approval["reasons"]:
            out.write(f"{'':>14}  - {_cell(reason['reason'])}\n")
    budget = quote["budget"]
    if budget is None:
        out.write(f"{'budget':>14}: none set\n")
    else:
        unit = currency if budget["unit"] == "money" else "GPU-hours"
        lines = {
            "budget": f"{budget['remaining']} {unit} left of {budget['limit']}",
            "budget of": f"{budget['tenant']}, {budget['month']}",
            "budget used": f"{budget['percent']} % (spent or committed)",
            "after the job": f"{budget['remaining_after']} {unit} left",
        }
        for label, value in lines.items():
            out.write(f"{label:>14}: {_cell(value)}\n")


def cmd_submit(args: argparse.Namespace, client: Client, out: TextIO) -> None:
    spec = read_spec(args.spec)
    if args.name:
        spec["name"] = args.name
    if args.dry_run:
        body = {"project": resolve_project(client, args.project), "spec": spec}
        quote = client.post("/api/v1/quotes/", body)
        if args.json:
            emit(args, quote, None, out)
        else:
            print_quote(quote, out)
        if quote.get("refused"):
            raise WouldBeRefused
        return
    # One key per invocation: the client's own retries can never create a second job.
    key = args.idempotency_key or f"cli-{uuid.uuid4()}"
    body = {"project": resolve_project(client, args.project), "spec": spec}
    job = client.post("/api/v1/jobs/", body, headers={"Idempotency-Key": key})
    emit(args, job, ["id", "name", "state", "priority_class", "gpus_total", "reason"], out)


def cmd_jobs(args: argparse.Namespace, client: Client, out: TextIO) -> None:
    params = {
        "state": args.state,
        "project": args.project,
        "job_type": args.type,
        "origin": args.origin,
    }
    rows = (
        list(client.pages("/api/v1/jobs/", **params))
        if args.all
        else client.get("/api/v1/jobs/", page_size=args.limit, **params)["results"]
    )
    emit(args, rows, JOB_COLUMNS, out)


def cmd_job(args: argparse.Namespace, client: Client, out: TextIO) -> None:
    job = client.get(f"/api/v1/jobs/{args.id}/")
    if job.get("state") == "queued":
        job["queue"] = client.get(f"/api/v1/jobs/{args.id}/queue/")
    job["pods"] = list(client.pages(f"/api/v1/jobs/{args.id}/pods/"))
    columns = [*JOB_COLUMNS, "attempt", "created_at", "started_at", "finished_at"]
    if origin := job.get("origin"):  # created in Kubernetes (kubectl, an SDK)
        job["created_in"] = f"Kubernetes {origin['kind']} {origin['namespace']}/{origin['name']}"
        columns.append("created_in")
    if args.json or not job.get("queue", {}).get("waiting"):
        emit(args, job, columns, out)
    else:
        emit(args, {**job, **queue_lines(job["queue"])}, [*columns, *QUEUE_LINES], out)
    if not args.json and job["pods"]:
        out.write("\npods:\n")
        table(logs.pod_rows(job["pods"]), logs.POD_COLUMNS, out)


QUEUE_LINES = ["position", "ahead", "starts", "starts_in"]


def queue_lines(queue: dict[str, Any]) -> dict[str, str]:
    """The queue sub-resource as four lines: position, the jobs ahead, the start range, and
    the same in words from the server's time ("in about 25 min (p90 1 h 10 min)"). A job
    queued since the scheduler's last pass has no position yet: its note says so."""
    if queue["position_cluster"] is None:
        note = queue.get("position_note") or "not placed in the queue yet"
        return {"position": note, "ahead": "-", "starts": "not estimated yet", "starts_in": ""}
    ahead = f"{queue['ahead_count']} job(s)"
    listed = ", ".join(f"#{a['id']}" for a in queue["ahead"])
    if listed:
        ahead += f": {listed}"
    if queue["ahead_visible"] > len(queue["ahead"]):
        ahead += f" and {queue['ahead_visible'] - len(queue['ahead'])} more"
    if queue["ahead_hidden"]:
        ahead += f"; {queue['ahead_hidden']} of other teams"
    if queue["estimated_at"] is None:
        starts = "not estimated yet"
    elif queue["eta_p50"] is None:
        starts = "not within the next week"
    else:
        starts = f"{queue['eta_p50']} .. {queue['eta_p90'] or 'later'}"
    return {
        "position": f"{queue['position_tenant']} in team, {queue['position_cluster']} in cluster",
        "ahead": ahead,
        "starts": starts,
        "starts_in": when.starts_in(queue),
    }


def cmd_events(args: argparse.Namespace, client: Client, out: TextIO) -> None:
    rows = list(client.pages(f"/api/v1/jobs/{args.id}/events/"))
    emit(args, rows, ["at", "kind", "from_state", "to_state", "actor", "message"], out)


def cmd_cancel(args: argparse.Namespace, client: Client, out: TextIO) -> None:
    job = client.post(f"/api/v1/jobs/{args.id}/cancel/", {"reason": args.reason})
    emit(args, job, ["id", "name", "state"], out)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="gantry", description="Gantry GPU scheduler client.")
    parser.add_argument("--json", action="store_true", help="print JSON instead of tables")
    parser.add_argument("--version", action="version", version=f"gantry {client_version()}")
    sub = parser.add_subparsers(dest="command", required=True)
    login = sub.add_parser("login", help="get an API token and save it")
    login.add_argument("username")
    login.add_argument("--url", help=f"server URL (default $GANTRY_URL or {DEFAULT_URL})")
    login.set_defaults(func=cmd_login)
    sub.add_parser(
        "rotate-token", help="replace your saved token with a fresh one (the old one stops)"
    ).set_defaults(func=cmd_rotate_token)
    sub.add_parser("whoami", help="your user and roles").set_defaults(func=cmd_whoami)
    sub.add_parser("projects", help="projects you can see").set_defaults(func=cmd_projects)
    quotas = sub.add_parser("quotas", help="quotas you can see")
    quotas.add_argument("--tenant", type=int)
    quotas.set_defaults(func=cmd_quotas)
    submit = sub.add_parser("submit", help="submit a job from a YAML/JSON spec ('-' = stdin)")
    submit.add_argument("spec")
    submit.add_argument("--project", required=True, help="project id or slug")
    submit.add_argument("--name", help="override the spec's name")
    submit.add_argument("--idempotency-key", help="repeat-safe key (default: one per run)")
    submit.add_argument(
        "--dry-run",
        action="store_true",
        help="show the quote (cost range, approval and why, budget left, whether a submit "
        f"would be refused and why: then exit {WOULD_BE_REFUSED}); submit nothing",
    )
    submit.set_defaults(func=cmd_submit)
    jobs = sub.add_parser("jobs", help="list jobs")
    jobs.add_argument("--state", action="append")
    jobs.add_argument("--type", action="append")
    jobs.add_argument("--project", type=int)
    jobs.add_argument("--limit", type=int, default=50)
    jobs.add_argument("--all", action="store_true", help="every page")
    jobs.add_argument(
        "--origin",
        choices=["gantry", "kubernetes"],
        help="only jobs submitted through Gantry, or only those created in Kubernetes",
    )
    jobs.set_defaults(func=cmd_jobs)
    for name, func, text in [
        ("job", cmd_job, "one job"),
        ("events", cmd_events, "a job's history"),
    ]:
        one = sub.add_parser(name, help=text)
        one.add_argument("id", type=int)
        one.set_defaults(func=func)
    logs.add_parsers(sub)
    cancel = sub.add_parser("cancel", help="cancel a job")
    cancel.add_argument("id", type=int)
    cancel.add_argument("--reason", default="")
    cancel.set_defaults(func=cmd_cancel)
    cluster.add_parsers(sub, emit)
    clusters.add_parsers(sub, emit)
    capacity.add_parsers(sub, emit)
    quota_requests.add_parsers(sub, emit)
    rate_cards.add_parsers(sub, emit)
    what_ifs.add_parsers(sub, emit)
    return parser


def main(
    argv: Sequence[str] | None = None, out: TextIO | None = None, err: TextIO | None = None
) -> int:
    out, err = out or sys.stdout, err or sys.stderr
    args = build_parser().parse_args(argv)
    settings = load_config()
    client = Client(url=settings["url"], token=settings["token"] or None)
    try:
        args.func(args, client, out)
    except ApiError as exc:
        err.write(exc.describe() + "\n")
        if exc.status == 401 and "expired" in str(exc.body):
            err.write("gantry: your token expired; run `gantry login USERNAME` for a new one\n")
        return 1
    except UsageError as exc:
        err.write(f"gantry: {exc}\n")
        return 2
    except ConnectionFailed as exc:
        err.write(f"gantry: {exc}\n")
        return 3
    except WouldBeRefused:
        err.write("gantry: a submit would be refused (see the quote); nothing was submitted\n")
        return WOULD_BE_REFUSED
    return 0


if __name__ == "__main__":
    sys.exit(main())
