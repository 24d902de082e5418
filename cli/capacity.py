"""`gantry capacity`: per pool (platform admins, finance) or per subtree you administer, the
demand today and forecast 30, 90 and 180 days ahead, the saturation days and the drivers.
One API call per page (GET /api/v1/capacity/plans/)."""

from __future__ import annotations

import argparse
from collections.abc import Callable, Sequence
from typing import Any, TextIO

from cli.client import Client

Emit = Callable[[argparse.Namespace, Any, Sequence[str] | None, TextIO], None]
COLUMNS = [
    "pool",
    "subtree",
    "gpus",
    "today",
    "in_30d",
    "in_90d",
    "in_180d",
    "full_p50",
    "full_p90",
    "drivers",
]
AHEAD = (30, 90, 180)


def _week(values: list[float], end: int) -> float | None:
    """Mean of the week ending on day `end` (1-based), None past the forecast."""
    if end > len(values) or end < 1:
        return None
    week = values[max(end - 7, 0) : end]
    return sum(week) / len(week)


def _band(series: dict[str, Any], day: int) -> str:
    mid = _week(series["p50"], day)
    if mid is None:
        return "-"
    low, high = _week(series["p10"], day), _week(series["p90"], day)
    return f"{mid:,.0f} ({low:,.0f}-{high:,.0f})"


def plan_rows(plans: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """GPU-hours a day: the last week's mean, and the forecast's p50 (p10-p90) in a week."""
    rows = []
    for plan in plans:
        series, sat = plan["series"], plan["saturation"]
        today = _week(series["requested"], len(series["requested"])) or 0.0
        drivers = [f"{d['name']} {d['share']:.0%}" for d in plan["drivers"][:3] if d["share"] > 0]
        row = {
            "pool": plan["flavor"] or "(any model)",
            "subtree": plan["subtree"] or "(whole pool)",
            "gpus": "-" if plan["capacity_gpus"] is None else f"{plan['capacity_gpus']:g}",
            "today": f"{today:,.0f}",
            "full_p50": (sat["p50_day"] or "not in sight") if sat else "-",
            "full_p90": (sat["p90_day"] or "not in sight") if sat else "-",
            "drivers": ", ".join(drivers) or "-",
        }
        row.update({f"in_{d}d": _band(series, d) for d in AHEAD})
        rows.append(row)
    return rows


def cmd_capacity(args: argparse.Namespace, client: Client, out: TextIO, emit: Emit) -> None:
    params = {"flavor": args.pool, "gpus": args.gpus}
    plans = list(client.pages("/api/v1/capacity/plans/", **params))
    emit(args, plans if args.json else plan_rows(plans), COLUMNS, out)


def add_parsers(sub: Any, emit: Emit) -> None:
    capacity = sub.add_parser(
        "capacity",
        help="demand forecasts per pool: GPU-hours a day ahead, the day each pool is full",
    )
    capacity.add_argument("--pool", help="one GPU model (flavor), e.g. H100-80GB")
    capacity.add_argument("--gpus", type=int, help="price an option of N more GPUs (--json)")
    capacity.set_defaults(func=lambda args, client, out: cmd_capacity(args, client, out, emit))
