"""`gantry whatif`: what-if replays of the last days' jobs under proposed quotas, weights and
priorities (docs/what-if.md): the runs you may see, one run with its progress and results
side by side, and a new run from a proposal file. Through /api/v1/what-ifs/."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TextIO

import yaml

from cli.client import Client
from cli.files import load_yaml
from cli.usage import UsageError, tenant_id

Emit = Callable[[argparse.Namespace, Any, Sequence[str] | None, TextIO], None]
COLUMNS = ["id", "state", "progress", "scope", "requested_by", "window_days", "changes"]
DETAIL = [*COLUMNS, "approval_request", "error", "created_at", "finished_at", "expires_at"]
RESULTS = ["tenant", "side", "jobs", "started", "never_started", "mean_wait", "p90_wait"]
RESULTS += ["gpu_hours", "borrowed_gpu_hours", "preemptions"]
URL = "/api/v1/what-ifs/"


def row(run: dict[str, Any]) -> dict[str, Any]:
    """A run as a line; its changes in the server's words ("team-bravo, H100-80GB: limit 24
    GPUs, weight 2"), every kind of change with its own units."""
    progress = run["progress"]
    return {
        **run,
        "progress": f"{progress['percent']}% {progress['stage']}".strip(),
        "scope": run["scope"] or "(platform)",
        "changes": "; ".join(run["changes_described"]),
    }


def _seconds(value: float | None) -> str:
    return "-" if value is None else f"{value:,.0f} s"


def result_rows(results: dict[str, Any]) -> list[dict[str, Any]]:
    """A line per tenant and side (baseline, then proposed)."""
    out = []
    for tenant in results["tenants"]:
        for side in ("baseline", "proposed"):
            figures = tenant[side]
            out.append(
                {
                    **figures,
                    "tenant": tenant["tenant"],
                    "side": side,
                    "mean_wait": _seconds(figures["mean_wait_s"]),
                    "p90_wait": _seconds(figures["p90_wait_s"]),
                    "gpu_hours": f"{figures['gpu_hours']:g}",
                    "borrowed_gpu_hours": f"{figures['borrowed_gpu_hours']:g}",
                }
            )
    return out


def cmd_list(args: argparse.Namespace, client: Client, out: TextIO, emit: Emit) -> None:
    runs = list(client.pages(URL, state=args.state))
    emit(args, runs if args.json else [row(r) for r in runs], COLUMNS, out)


def cmd_show(args: argparse.Namespace, client: Client, out: TextIO, emit: Emit) -> None:
    run = client.get(f"{URL}{args.id}/")
    if args.json:
        emit(args, run, None, out)
        return
    emit(args, row(run), DETAIL, out)
    results = run.get("results")
    if not results:
        out.write("\nno results yet\n" if run["state"] in ("queued", "running") else "")
        return
    totals = results["totals"]
    out.write(f"\njobs found {results['jobs_found']}, replayed {results['jobs_replayed']}")
    out.write(" (capped)\n" if results.get("capped") else "\n")
    for side in ("baseline", "proposed"):
        t = totals[side]
        out.write(
            f"{side:>9}: utilization {t['utilization']:.1%}, fairness {t['fairness']:.2f}, "
            f"preemptions {t['preemptions']}, borrowed {t['borrowed_gpu_hours']:g} GPU-hours\n"
        )
    out.write("\n")
    emit(args, result_rows(results), RESULTS, out)


def read_proposal(path: str) -> dict[str, Any]:
    """A proposal file (YAML or JSON; '-' stdin): a list of changes, or a mapping with
    `changes` (and `scope`, `window_days`)."""
    try:
        text = sys.stdin.read() if path == "-" else Path(path).read_text()
        data = load_yaml(text)
    except (OSError, yaml.YAMLError) as exc:
        raise UsageError(f"cannot read the proposal {path}: {exc}") from None
    if isinstance(data, list):
        data = {"changes": data}
    if not isinstance(data, dict) or not isinstance(data.get("changes"), list):
        raise UsageError(
            f"the proposal {path} must be a list of changes, or a mapping with `changes:` "
            "(and `scope:`, `window_days:`); see docs/what-if.md."
        )
    return data


def cmd_run(args: argparse.Namespace, client: Client, out: TextIO, emit: Emit) -> None:
    body = read_proposal(args.proposal)
    if args.scope is not None:
        body["scope"] = args.scope
    if isinstance(body.get("scope"), str):  # a slug (or id) in the file or on the line
        body["scope"] = tenant_id(client, body["scope"])
    if args.window_days is not None:
        body["window_days"] = args.window_days
    made = client.post(URL, body)
    emit(args, made if args.json else row(made), DETAIL, out)


def add_parsers(sub: Any, emit: Emit) -> None:
    top = sub.add_parser("whatif", help="what-if replays under proposed quotas and priorities")
    top.add_argument("--state", choices=["queued", "running", "done", "failed"])
    top.set_defaults(func=lambda args, client, out: cmd_list(args, client, out, emit))
    actions = top.add_subparsers(dest="action")
    show = actions.add_parser("show", help="one run: its progress, then its results")
    show.add_argument("id", type=int)
    show.set_defaults(func=lambda args, client, out: cmd_show(args, client, out, emit))
    run = actions.add_parser("run", help="replay a proposal file (platform and tenant admins)")
    run.add_argument("proposal", help="YAML or JSON: a list of changes ('-' = stdin)")
    run.add_argument("--scope", help="the tenant (slug or id) whose subtree the run is for")
    run.add_argument("--window-days", dest="window_days", type=int)
    run.set_defaults(func=lambda args, client, out: cmd_run(args, client, out, emit))
