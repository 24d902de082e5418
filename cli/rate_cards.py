"""`gantry rate-cards`: the price list, each chain of versions per GPU model and cluster (the
default card: cluster "default") with its effective dates and prices as money (the currency's
minor units; --json keeps the API's strings); finance and platform admins add a version
(docs/billing.md, "Rates"). Through /api/v1/rate-cards/."""

from __future__ import annotations

import argparse
from collections.abc import Callable, Sequence
from typing import Any, TextIO

from cli.client import Client
from cli.money import money
from cli.usage import UsageError, flavor_id

Emit = Callable[[argparse.Namespace, Any, Sequence[str] | None, TextIO], None]
COLUMNS = [
    "id",
    "flavor",
    "cluster",
    "version",
    "valid_from",
    "valid_to",
    "gpu_hour",
    "cpu_core_hour",
    "memory_gib_hour",
    "borrowed_discount",
    "multipliers",
]
URL = "/api/v1/rate-cards/"
DEFAULT = "default"  # how the default card (no cluster) is named here


def chains(cards: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The cards by GPU model, cluster (the default card first) and start, each numbered
    within its chain (1: the first version)."""
    ordered = sorted(cards, key=lambda c: (c["flavor_name"], c["cluster"] or "", c["valid_from"]))
    numbered, last, version = [], None, 0
    for card in ordered:
        chain = (card["flavor_name"], card["cluster"])
        version = version + 1 if chain == last else 1
        last = chain
        numbered.append({**card, "version": version})
    return numbered


def rows(cards: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [
        {
            "id": c["id"],
            "flavor": c["flavor_name"],
            "cluster": c["cluster"] or DEFAULT,
            "version": c.get("version", ""),
            "valid_from": c["valid_from"],
            "valid_to": c["valid_to"] or "(open)",
            "gpu_hour": f"{c['currency']} {money(c['gpu_hour'], c['currency'])}",
            "cpu_core_hour": money(c["cpu_core_hour"], c["currency"]),
            "memory_gib_hour": money(c["memory_gib_hour"], c["currency"]),
            "borrowed_discount": c["borrowed_discount"],
            "multipliers": ",".join(
                f"{k}={v}" for k, v in sorted(c["priority_multipliers"].items())
            ),
        }
        for c in cards
    ]


def cmd_list(args: argparse.Namespace, client: Client, out: TextIO, emit: Emit) -> None:
    cards = chains(list(client.pages(URL)))
    if args.flavor:
        cards = [c for c in cards if c["flavor_name"] == args.flavor]
    if args.cluster:
        wanted = None if args.cluster == DEFAULT else args.cluster
        cards = [c for c in cards if c["cluster"] == wanted]
    emit(args, cards if args.json else rows(cards), COLUMNS, out)


def multipliers(pairs: Sequence[str]) -> dict[str, str]:
    out = {}
    for pair in pairs:
        name, sep, value = pair.partition("=")
        if not sep or not name or not value:
            raise UsageError(f"--multiplier {pair!r}: write it as CLASS=FACTOR, e.g. high=1.5")
        out[name] = value
    return out


def cmd_add(args: argparse.Namespace, client: Client, out: TextIO, emit: Emit) -> None:
    body: dict[str, Any] = {
        "flavor": flavor_id(client, args.flavor),
        "cluster": None if args.cluster in (None, DEFAULT) else args.cluster,
        "valid_from": args.valid_from,
        "gpu_hour": args.gpu_hour,
        "priority_multipliers": multipliers(args.multiplier or ()),
    }
    for key in ("valid_to", "cpu_core_hour", "memory_gib_hour", "borrowed_discount"):
        if getattr(args, key) is not None:
            body[key] = getattr(args, key)
    made = client.post(URL, body)
    emit(args, made if args.json else rows([made]), COLUMNS, out)


def add_parsers(sub: Any, emit: Emit) -> None:
    top = sub.add_parser("rate-cards", help="prices per GPU model and cluster, by version")
    top.add_argument("--flavor", help="one GPU model, e.g. H100-80GB")
    top.add_argument("--cluster", help=f"one cluster's own cards ({DEFAULT!r}: the default card)")
    top.set_defaults(func=lambda args, client, out: cmd_list(args, client, out, emit))
    actions = top.add_subparsers(dest="action")
    add = actions.add_parser("add", help="add a version (finance and platform admins)")
    add.add_argument("--flavor", required=True, help="GPU model, e.g. H100-80GB")
    add.add_argument("--cluster", help=f"a cluster's name (default: {DEFAULT!r}, the default card)")
    add.add_argument(
        "--from", dest="valid_from", required=True, help="start, on the hour: 2031-02-01T00:00Z"
    )
    add.add_argument("--to", dest="valid_to", help="end (default: open-ended)")
    add.add_argument("--gpu-hour", dest="gpu_hour", required=True, help="price, e.g. 2.50")
    add.add_argument("--cpu-core-hour", dest="cpu_core_hour")
    add.add_argument("--memory-gib-hour", dest="memory_gib_hour")
    add.add_argument("--borrowed-discount", dest="borrowed_discount", help="0.3 = 30 %% off")
    add.add_argument(
        "--multiplier", action="append", metavar="CLASS=FACTOR", help="per priority class"
    )
    add.set_defaults(func=lambda args, client, out: cmd_add(args, client, out, emit))
