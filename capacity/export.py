"""The capacity plans as a file: CSV (one table of figures) or XLSX (the figures, and the daily
history and forecast on a second sheet). Written from `present.PoolPlan`s: what the viewer
sees on the page, nothing more. Names go through billing's formula guard (`csv_safe`)."""

from __future__ import annotations

import csv
import io
from collections.abc import Iterator
from datetime import datetime, timedelta
from typing import Any

from django.http import HttpResponse
from openpyxl import Workbook
from openpyxl.cell import WriteOnlyCell
from openpyxl.styles import Font

from capacity.present import PoolPlan
from common.text import csv_safe

FIGURE_HEADER = ["pool", "subtree", "figure", "value", "explain"]
DAILY_HEADER = [
    "pool",
    "subtree",
    "date",
    "requested",
    "allocated",
    "used",
    "p10",
    "p50",
    "p90",
    "seasonal_naive",
]
CONTENT_TYPES = {
    "csv": "text/csv",
    "xlsx": "application/vnd.openxmlformats-officedocument.spreadsheetml.sheet",
}


def _money(value: float) -> float:
    return round(value, 2)


def figure_rows(plan: PoolPlan) -> Iterator[list[Any]]:
    who = plan.subtree or ""
    head = [plan.flavor, who]
    if plan.capacity_gpus is not None:
        yield [*head, "capacity_gpus", plan.capacity_gpus, "healthy GPUs at the refresh"]
        yield [*head, "target_utilization", plan.target, "the pool is full at this share"]
    if plan.saturation is not None:
        s = plan.saturation
        yield [*head, "saturation_p50", s.p50_day.isoformat() if s.p50_day else "", s.explain]
        yield [*head, "saturation_p90", s.p90_day.isoformat() if s.p90_day else "", s.explain]
    for d in plan.drivers:
        yield [
            *head,
            f"driver {d.name}",
            round(d.growth, 3),
            f"{d.recent:.1f} -> {d.ahead:.1f} GPU-hours a day ({d.share:.0%} of the growth)",
        ]
    for name, figure in plan.tco.items():
        yield [*head, name, figure.value if figure.value is not None else "", figure.explain]
    for o in plan.options:
        label = f"option {o.gpus:+d} GPUs"
        yield [
            *head,
            f"{label} saturation_p50",
            o.saturation.p50_day.isoformat() if o.saturation.p50_day else "",
            o.saturation.explain,
        ]
        if o.months:
            yield [*head, f"{label} own", _money(o.own_total), f"{len(o.months)} months owned"]
            yield [*head, f"{label} on_demand", _money(o.on_demand_total), "rented by the hour"]
            yield [*head, f"{label} committed", _money(o.committed_total), "rented, committed"]
        if o.break_even_month is not None:
            value = o.break_even_month.value
            yield [
                *head,
                f"{label} break_even_month",
                "" if value is None else value,
                o.break_even_month.explain,
            ]


def daily_rows(plan: PoolPlan) -> Iterator[list[Any]]:
    s = plan.series
    who = plan.subtree or ""
    for i, requested in enumerate(s.requested):
        day = plan.first_day + timedelta(days=i)
        yield [
            plan.flavor,
            who,
            day.isoformat(),
            requested,
            s.allocated[i],
            s.used[i],
            "",
            "",
            "",
            "",
        ]
    for i, p50 in enumerate(s.p50):
        day = plan.last_day + timedelta(days=i + 1)
        yield [
            plan.flavor,
            who,
            day.isoformat(),
            "",
            "",
            "",
            s.p10[i],
            p50,
            s.p90[i],
            s.baseline[i],
        ]


def _safe(row: list[Any]) -> list[Any]:
    return [csv_safe(v) if isinstance(v, str) else v for v in row]


def write_csv(plans: list[PoolPlan]) -> bytes:
    out = io.StringIO()
    writer = csv.writer(out)
    writer.writerow(FIGURE_HEADER)
    for plan in plans:
        writer.writerows(_safe(row) for row in figure_rows(plan))
    return out.getvalue().encode()


def _bold(sheet: Any, value: str) -> Any:
    cell = WriteOnlyCell(sheet, value=value)
    cell.font = Font(bold=True)
    return cell


def write_xlsx(plans: list[PoolPlan]) -> bytes:
    book = Workbook(write_only=True)
    for title, header, rows in (
        ("Figures", FIGURE_HEADER, figure_rows),
        ("Daily", DAILY_HEADER, daily_rows),
    ):
        sheet = book.create_sheet(title=title)
        sheet.append([_bold(sheet, title_) for title_ in header])
        for plan in plans:
            for row in rows(plan):
                sheet.append(_safe(row))
    out = io.BytesIO()
    book.save(out)
    return out.getvalue()


def attachment(plans: list[PoolPlan], fmt: str, *, now: datetime) -> HttpResponse:
    """The plans as a download named for the day (`fmt`: a key of CONTENT_TYPES)."""
    body = write_csv(plans) if fmt == "csv" else write_xlsx(plans)
    response = HttpResponse(body, content_type=CONTENT_TYPES[fmt])
    stamp = now.strftime("%Y%m%d")
    response["Content-Disposition"] = f'attachment; filename="capacity-{stamp}.{fmt}"'
    return response
