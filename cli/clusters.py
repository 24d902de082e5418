"""`gantry clusters`: the clusters Gantry drives, each with its state, nodes, GPUs, use and
when it last answered; platform admins add one, label it (`label site-b storage=ceph
data.example.com/imagenet=true old-` as kubectl labels: `key-` removes) and cordon or
uncordon it (docs/multicluster.md). One API call per page, or per change."""

from __future__ import annotations

import argparse
from collections.abc import Callable, Sequence
from typing import Any, TextIO

from cli.client import ApiError, Client

Emit = Callable[[argparse.Namespace, Any, Sequence[str] | None, TextIO], None]
COLUMNS = [
    "name",
    "backend",
    "state",
    "region",
    "site",
    "nodes",
    "gpus",
    "in_use",
    "last_seen",
    "labels",
]
# Shown in their own columns, not among the other labels.
PLACE = ("region", "site")


def rows(clusters: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out = []
    for c in clusters:
        use = c["utilization"]
        out.append(
            {
                "name": c["name"] + (" (home)" if c["home"] else ""),
                "backend": c["backend"],
                "state": c["state"],
                "region": c["labels"].get("region", ""),
                "site": c["labels"].get("site", ""),
                "nodes": f"{c['nodes_ready']}/{c['nodes']} ready",
                "gpus": c["gpus"],
                "in_use": "-" if use is None else f"{c['gpus_allocated']:g} ({use:.0%})",
                "last_seen": c["last_seen_at"] or "-",
                "labels": ",".join(
                    f"{k}={v}" for k, v in sorted(c["labels"].items()) if k not in PLACE
                ),
            }
        )
    return out


def _by_name(client: Client, name: str) -> dict[str, Any]:
    for cluster in client.pages("/api/v1/clusters/"):
        if cluster["name"] == name:
            return cluster
    raise ApiError(404, {"detail": f"no cluster named {name!r} that you may see"})


def parse_labels(pairs: Sequence[str], *, removals: bool = False) -> dict[str, str | None]:
    """`key=value` pairs (and `key-`, a removal, where `removals`) as a dict (None: remove);
    the server checks the keys and values."""
    labels: dict[str, str | None] = {}
    for pair in pairs:
        if removals and pair.endswith("-") and "=" not in pair:
            labels[pair[:-1]] = None
        elif "=" in pair:
            key, value = pair.split("=", 1)
            labels[key] = value
        else:
            removal = " or key- to remove it" if removals else ""
            raise ApiError(400, {"detail": f"{pair!r}: write a label as key=value{removal}"})
    return labels


def cmd_clusters(args: argparse.Namespace, client: Client, out: TextIO, emit: Emit) -> None:
    if args.action == "add":
        body: dict[str, Any] = {"name": args.name, "backend": args.backend}
        for key in ("kubeconfig_path", "kubeconfig_secret", "kube_context", "lost_after_s"):
            if getattr(args, key) is not None:
                body[key] = getattr(args, key)
        labels = {k: v for k, v in parse_labels(args.label or ()).items() if v is not None}
        labels.update({k: v for k, v in (("region", args.region), ("site", args.site)) if v})
        if labels:
            body["labels"] = labels
        made = client.post("/api/v1/clusters/", body)
        emit(args, made if args.json else rows([made]), COLUMNS, out)
        return
    if args.action == "label":
        cluster = _by_name(client, args.name)
        asked = parse_labels(args.labels, removals=True)
        merged: dict[str, str | None] = {**cluster["labels"], **asked}
        body = {"labels": {k: v for k, v in merged.items() if v is not None}}
        changed = client.request("PATCH", f"/api/v1/clusters/{cluster['id']}/", body)
        emit(args, changed if args.json else rows([changed]), COLUMNS, out)
        return
    if args.action in ("cordon", "uncordon"):
        cluster = _by_name(client, args.name)
        changed = client.post(f"/api/v1/clusters/{cluster['id']}/{args.action}/")
        emit(args, changed if args.json else rows([changed]), COLUMNS, out)
        return
    clusters = list(client.pages("/api/v1/clusters/"))
    emit(args, clusters if args.json else rows(clusters), COLUMNS, out)


def add_parsers(sub: Any, emit: Emit) -> None:
    clusters = sub.add_parser("clusters", help="the clusters Gantry drives (admins)")
    actions = clusters.add_subparsers(dest="action")
    add = actions.add_parser("add", help="add a cluster (platform admins)")
    add.add_argument("name")
    add.add_argument("--backend", choices=["kubernetes", "simulated"], default="kubernetes")
    add.add_argument("--kubeconfig-path", dest="kubeconfig_path")
    add.add_argument(
        "--kubeconfig-secret", dest="kubeconfig_secret", help="a file of the mounted Secret"
    )
    add.add_argument("--context", dest="kube_context")
    add.add_argument("--region")
    add.add_argument("--site")
    add.add_argument("--lost-after", dest="lost_after_s", type=int, help="seconds")
    add.add_argument(
        "--label", action="append", metavar="KEY=VALUE", help="a label (repeat for more)"
    )
    label = actions.add_parser(
        "label", help="set (key=value) or remove (key-) a cluster's labels (platform admins)"
    )
    label.add_argument("name")
    label.add_argument("labels", nargs="+", metavar="KEY=VALUE|KEY-")
    for action, text in [
        ("cordon", "place nothing new in a cluster (platform admins)"),
        ("uncordon", "place jobs in a cordoned cluster again (platform admins)"),
    ]:
        one = actions.add_parser(action, help=text)
        one.add_argument("name")
    clusters.set_defaults(func=lambda args, client, out: cmd_clusters(args, client, out, emit))
