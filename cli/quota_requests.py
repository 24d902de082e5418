"""`gantry quota-requests`: ask the admins above for a quota (global, or pinned to a cluster),
see your requests and withdraw a pending one; as an approver, the pending ones you decide;
approve or reject one. Through /api/v1/quota-requests/ and /api/v1/approval-requests/
(docs/multicluster.md)."""

from __future__ import annotations

import argparse
from collections.abc import Callable, Sequence
from typing import Any, TextIO

from cli.client import Client
from cli.usage import UsageError, cluster_id, flavor_id, tenant_id

Emit = Callable[[argparse.Namespace, Any, Sequence[str] | None, TextIO], None]
COLUMNS = [
    "id",
    "state",
    "tenant",
    "flavor",
    "cluster",
    "gpus",
    "limit",
    "requester",
    "decide",
    "created_at",
    "justification",
    "comment",
]
APPROVALS = "/api/v1/approval-requests/"


def rows(requests: list[dict[str, Any]], decide: set[int]) -> list[dict[str, Any]]:
    out = []
    for r in requests:
        payload, values = r["payload"], r["payload"].get("values", {})
        out.append(
            {
                "id": r["id"],
                "state": r["state"],
                "tenant": r["tenant_slug"],
                "flavor": payload.get("flavor_name"),
                "cluster": payload.get("cluster_name") or "(all)",
                "gpus": _gpus(values.get("guaranteed_milli")),
                "limit": _gpus(values.get("limit_milli")),
                "requester": r["requester"],
                "decide": "yes" if r["id"] in decide else "",
                "created_at": r["created_at"],
                "justification": payload.get("justification", ""),
                "comment": r["comment"],
            }
        )
    return out


def _gpus(milli: int | None) -> str:
    return "" if milli is None else f"{milli / 1000:g}"


def cmd_list(args: argparse.Namespace, client: Client, out: TextIO, emit: Emit) -> None:
    """Yours (or, with --all, every one you may see) and the pending ones you decide."""
    me = client.get("/api/v1/me/")["username"]
    inbox = list(client.pages(f"{APPROVALS}inbox/", kind="quota", state="pending"))
    decide = {r["id"] for r in inbox}
    seen = [] if args.inbox else list(client.pages(APPROVALS, kind="quota", state=args.state))
    if not (args.all or args.inbox):
        seen = [r for r in seen if r["requester"] == me]
    shown = {r["id"]: r for r in [*seen, *inbox] if not args.state or r["state"] == args.state}
    found = sorted(shown.values(), key=lambda r: -r["id"])
    emit(args, found if args.json else rows(found, decide), COLUMNS, out)


def _milli(gpus: float, flag: str) -> int:
    if gpus < 0:
        raise UsageError(f"{flag} must be 0 or more GPUs, not {gpus:g}.")
    return round(gpus * 1000)


def cmd_create(args: argparse.Namespace, client: Client, out: TextIO, emit: Emit) -> None:
    tenant = tenant_id(client, args.tenant)
    guaranteed = _milli(args.gpus, "--gpus")
    body: dict[str, Any] = {
        "tenant": tenant,
        "flavor": flavor_id(client, args.flavor),
        "cluster": cluster_id(client, args.cluster) if args.cluster else None,
        "guaranteed_milli": guaranteed,
        "justification": args.reason,
    }
    # A request changes only what it names; the server keeps the rest as the quota has it
    # when approved. The limit is named when given, or when it must rise to the guarantee
    # (or there is no quota yet: the guarantee).
    current = _current(client, tenant, args.flavor, args.cluster)
    if args.limit is not None:
        body["limit_milli"] = _milli(args.limit, "--limit")
    elif current is None or current["limit_milli"] < guaranteed:
        body["limit_milli"] = guaranteed
    made = client.post("/api/v1/quota-requests/", body)
    emit(args, made if args.json else rows([made], set()), COLUMNS, out)


def _current(client: Client, tenant: int, flavor: str, cluster: str | None) -> Any:
    for quota in client.pages("/api/v1/quotas/", tenant=tenant):
        if quota["flavor_name"] == flavor and quota.get("cluster_name") == cluster:
            return quota
    return None


def cmd_decide(args: argparse.Namespace, client: Client, out: TextIO, emit: Emit) -> None:
    comment = args.reason if args.action == "reject" else args.comment
    decided = client.post(f"{APPROVALS}{args.id}/{args.action}/", {"comment": comment})
    emit(args, decided if args.json else rows([decided], set()), COLUMNS, out)


def cmd_withdraw(args: argparse.Namespace, client: Client, out: TextIO, emit: Emit) -> None:
    """The requester (or an admin of the tenant) withdraws a pending request."""
    withdrawn = client.post(f"{APPROVALS}{args.id}/withdraw/")
    emit(args, withdrawn if args.json else rows([withdrawn], set()), COLUMNS, out)


def add_parsers(sub: Any, emit: Emit) -> None:
    top = sub.add_parser(
        "quota-requests",
        help="your quota requests and those you decide; ask, withdraw, approve, reject",
    )
    top.add_argument("--state", choices=["pending", "approved", "rejected", "expired", "cancelled"])
    top.add_argument("--inbox", action="store_true", help="only the pending ones you decide")
    top.add_argument("--all", action="store_true", help="every request you may see, not yours")
    top.set_defaults(func=lambda args, client, out: cmd_list(args, client, out, emit))
    actions = top.add_subparsers(dest="action")
    create = actions.add_parser("create", help="ask the admins above for a quota (tenant admins)")
    create.add_argument("--flavor", required=True, help="GPU model, e.g. H100-80GB")
    create.add_argument("--gpus", type=float, required=True, help="the guarantee asked, in GPUs")
    create.add_argument("--limit", type=float, help="GPUs (default: the current limit, or --gpus)")
    create.add_argument("--cluster", help="pin the quota to this cluster (default: global)")
    create.add_argument("--tenant", help="slug or id (default: the tenant you administer)")
    create.add_argument("--reason", required=True, help="why: the approvers read it")
    create.set_defaults(func=lambda args, client, out: cmd_create(args, client, out, emit))
    approve = actions.add_parser("approve", help="approve a pending request you decide")
    approve.add_argument("id", type=int)
    approve.add_argument("--comment", default="")
    reject = actions.add_parser("reject", help="reject a pending request you decide")
    reject.add_argument("id", type=int)
    reject.add_argument("--reason", required=True, help="told to the requester")
    for decide in (approve, reject):
        decide.set_defaults(func=lambda args, client, out: cmd_decide(args, client, out, emit))
    withdraw = actions.add_parser("withdraw", help="withdraw a pending request of yours")
    withdraw.add_argument("id", type=int)
    withdraw.set_defaults(func=lambda args, client, out: cmd_withdraw(args, client, out, emit))
