"""`gantry queue`, `gantry usage` and `gantry nodes`: your waiting jobs, your tenants against
their quotas, and the node inventory for platform admins. Each is one API call per page."""

from __future__ import annotations

import argparse
from collections.abc import Callable, Sequence
from typing import Any, TextIO

from cli import when
from cli.client import ApiError, Client

Emit = Callable[[argparse.Namespace, Any, Sequence[str] | None, TextIO], None]
QUEUE_COLUMNS = ["id", "name", "state", "project", "position", "starts", "reason"]
USAGE_COLUMNS = ["tenant", "flavor", "in_use", "guaranteed", "limit", "borrowing"]
NODE_COLUMNS = [
    "name",
    "pool",
    "model",
    "health",
    "schedulable",
    "gpus_free",
    "allocated",
    "xids_24h",
]


def _gpus(milli: int) -> str:
    return f"{milli / 1000:g}"


def queue_rows(jobs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    rows = []
    for job in jobs:
        if job["state"] == "pending_approval":
            position, starts = "-", "after approval"
        elif job["position_cluster"] is None:
            position, starts = "not placed yet", "not estimated yet"
        else:
            position = f"{job['position_tenant']} in team, {job['position_cluster']} in cluster"
            starts = _starts(job)
        project = f"{job['tenant_slug']}/{job['project_slug']}"
        rows.append({**job, "project": project, "position": position, "starts": starts})
    return rows


def _starts(job: dict[str, Any]) -> str:
    if job["estimated_at"] is None:
        return "not estimated yet"
    if job["eta_p50"] is None:
        return "not within the next week"
    return when.starts_in(job)


def cmd_queue(args: argparse.Namespace, client: Client, out: TextIO, emit: Emit) -> None:
    jobs = list(client.pages("/api/v1/queue/"))
    emit(args, jobs if args.json else queue_rows(jobs), QUEUE_COLUMNS, out)


def cmd_usage(args: argparse.Namespace, client: Client, out: TextIO, emit: Emit) -> None:
    rows = client.get("/api/v1/usage/", tenant=args.tenant)
    if not args.json:
        rows = [
            {
                "tenant": row["tenant_slug"],
                "flavor": row["flavor_name"],
                "in_use": _gpus(row["used_milli"]),
                "guaranteed": _gpus(row["guaranteed_milli"]),
                "limit": "none" if row["limit_milli"] is None else _gpus(row["limit_milli"]),
                "borrowing": ("yes" if row.get("quota", True) else "yes (no quota)")
                if row["borrowing"]
                else "",
            }
            for row in rows
        ]
    emit(args, rows, USAGE_COLUMNS, out)


def node_rows(nodes: list[dict[str, Any]]) -> list[dict[str, Any]]:
    rows = []
    for node in nodes:
        gpus = node["gpus"]
        sick = sum(not gpu["healthy"] for gpu in gpus)
        ready = node["ready"] and node["present"] and not node["sim_failed"]
        health = "not ready" if not ready else f"{sick} GPU(s) unhealthy" if sick else "healthy"
        free = sum(gpu["healthy"] and gpu["allocated_milli"] == 0 for gpu in gpus)
        schedulable = "draining" if node["drain_requested"] else "cordoned"
        rows.append(
            {
                "name": node["name"],
                "pool": node["pool"],
                "model": node["flavor"],
                "health": health,
                "schedulable": schedulable if node["cordoned"] else "yes",
                "gpus_free": f"{free}/{len(gpus)}",
                "allocated": _gpus(sum(gpu["allocated_milli"] for gpu in gpus)),
                "xids_24h": node.get("xids_24h", 0),
            }
        )
    return rows


def cmd_nodes(args: argparse.Namespace, client: Client, out: TextIO, emit: Emit) -> None:
    # The API also lists nodes to tenant admins and finance; this command is the platform
    # admins' inventory, and says so to anyone else rather than print an empty table.
    me = client.get("/api/v1/me/")
    if "platform_admin" not in me.get("platform_roles", []):
        raise ApiError(403, {"detail": "gantry nodes is for platform admins."})
    params = {"pool": args.pool, "flavor": args.model}
    if args.cluster:
        found = [c for c in client.pages("/api/v1/clusters/") if c["name"] == args.cluster]
        if not found:
            raise ApiError(404, {"detail": f"no cluster named {args.cluster!r}"})
        params["cluster"] = found[0]["id"]
    nodes = list(client.pages("/api/v1/nodes/", **params))
    emit(args, nodes if args.json else node_rows(nodes), NODE_COLUMNS, out)


def add_parsers(sub: Any, emit: Emit) -> None:
    """The three commands, on `gantry`'s subparsers (`emit`: main's output)."""

    def bind(command: Callable[..., None]) -> Callable[..., None]:
        return lambda args, client, out: command(args, client, out, emit)

    sub.add_parser("queue", help="your waiting jobs: position, reason, estimated start")
    sub.choices["queue"].set_defaults(func=bind(cmd_queue))
    usage = sub.add_parser("usage", help="your tenants' GPUs in use against their quotas")
    usage.add_argument("--tenant", type=int, help="a tenant id you may see (default: yours)")
    usage.set_defaults(func=bind(cmd_usage))
    nodes = sub.add_parser("nodes", help="the node inventory (platform admins)")
    nodes.add_argument("--pool")
    nodes.add_argument("--model", help="GPU model (flavor), e.g. H100-80GB")
    nodes.add_argument("--cluster", help="one cluster's nodes (`gantry clusters`)")
    nodes.set_defaults(func=bind(cmd_nodes))
