"""`gantry logs JOB`: a replica's log, and with --follow its new lines as they come (polling
the API with the cursor of the previous answer), and the pods table of `gantry job`."""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from typing import Any, TextIO

from cli.client import ApiError, Client, ConnectionFailed

FINAL_STATES = {"succeeded", "failed", "cancelled"}
POLL_S = 2.0
# "devices": which GPUs of its node the pod holds, by index (a count there read as none: "0").
POD_COLUMNS = ["attempt", "replica", "node", "devices", "bound_at", "ended_at", "end_reason"]
# Stands in for time.sleep; tests replace it so that following takes no wall-clock time.
sleep: Callable[[float], None] = time.sleep


def _devices(pod: dict[str, Any]) -> str:
    """ "#0, #1 (H100-80GB)" for whole GPUs (their indices on the node); "#0 x0.5 (H100-80GB)"
    for a share of one."""
    parts = [
        f"#{d['index']}" + (f" x{d['share_milli'] / 1000:g}" if d["share_milli"] < 1000 else "")
        for d in pod["devices"]
    ]
    models = sorted({d["model"] for d in pod["devices"] if d["model"]})
    return ", ".join(parts) + (f" ({', '.join(models)})" if models else "") if parts else "none"


def pod_rows(pods: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [
        {**pod, "devices": _devices(pod), "ended_at": pod["ended_at"] or "running"} for pod in pods
    ]


def _clean(text: str) -> str:
    # A log line must not move the terminal's cursor or change its colours.
    return "".join(ch if ch.isprintable() or ch == "\t" else "?" for ch in text)


def _show(
    body: dict[str, Any], out: TextIO, err: TextIO, shown: dict[str, str], as_json: bool
) -> None:
    """The lines (with --json, one JSON object per line: `at`, `text`); a message once."""
    for line in body["lines"]:
        out.write((json.dumps(line) if as_json else _clean(line["text"])) + "\n")
    out.flush()
    if body["message"] and body["message"] != shown.get("message"):
        err.write(f"gantry: {_clean(body['message'])}\n")
    shown["message"] = body["message"]


def cmd_logs(args: argparse.Namespace, client: Client, out: TextIO) -> None:
    """Ctrl-C while following ends the command quietly (exit 0)."""
    try:
        follow_logs(args, client, out, sys.stderr)
    except KeyboardInterrupt:
        out.flush()


def follow_logs(args: argparse.Namespace, client: Client, out: TextIO, err: TextIO) -> None:
    """Print the last lines; following, poll from the cursor until the pod's log is complete
    and the job final. An attempt that ends while the job goes on (preempted, requeued) is
    followed by the next one's lines when it runs."""
    path = f"/api/v1/jobs/{args.id}/logs/"
    pinned, cursor, finished = args.attempt, "", None
    shown: dict[str, str] = {}
    polled = False
    while True:
        query = {"since": cursor} if cursor else {"tail": args.tail}
        try:
            body = client.get(path, replica=args.replica, attempt=pinned, **query)
        except (ApiError, ConnectionFailed):
            if polled:
                # Following broke off: the lines printed stand; say so and how to go on
                # (main then prints why, and exits non-zero: 1 refused, 3 unreachable).
                err.write(
                    f"gantry: following job {args.id}'s log stopped; "
                    f"`gantry logs {args.id} --follow` follows it again.\n"
                )
            raise
        polled = True
        if body["attempt"] is None or body["attempt"] != finished:
            _show(body, out, err, shown, args.json)
            cursor = body["cursor"]
            pinned = body["attempt"] if pinned is None else pinned
        if not args.follow or _over(args, body):
            return
        if body["done"] and body["attempt"] is not None and body["attempt"] != finished:
            finished, pinned, cursor = body["attempt"], None, ""
        sleep(POLL_S)


def _over(args: argparse.Namespace, body: dict[str, Any]) -> bool:
    if body["state"] in FINAL_STATES:
        return bool(body["done"]) or body["pod"] is None
    return bool(body["done"]) and args.attempt is not None


def add_parsers(sub: Any) -> None:
    logs = sub.add_parser("logs", help="a job's log (one replica); --follow to keep reading")
    logs.add_argument("id", type=int)
    logs.add_argument("--replica", type=int, default=0, help="which replica (default 0)")
    logs.add_argument("--attempt", type=int, help="an earlier attempt (default: the latest)")
    logs.add_argument("--tail", type=int, default=200, help="the last N lines (default 200)")
    logs.add_argument(
        "--follow", "-f", action="store_true", help="keep printing new lines until the job ends"
    )
    logs.set_defaults(func=cmd_logs)
