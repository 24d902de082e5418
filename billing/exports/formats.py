"""Finance exports: the cost API's figures as CSV, XLSX, and FOCUS 1.0 CSV.

The rows come from the cost API's own source (`selectors.cost_lines_visible`, `aggregate`,
`totals`), so an export adds up to what the API says for the same query, to the cent, and
holds exactly the lines its user may see when it is written.

Writers stream: each row goes to `out` as it is made (CSV through a text wrapper, XLSX
through openpyxl's write-only mode, which keeps its sheet in a temporary file until the
archive is written), so the writer's memory does not grow with the number of rows.

Every text cell of a CSV goes through `common.text.csv_safe`, the audit export's helper: a
name that starts with = + - @ (or a tab or carriage return) is written with a leading
apostrophe, so that no spreadsheet runs it as a formula. XLSX keeps names as typed, in text
cells that are never formulas (`write_xlsx`). Numbers stay numbers.

FOCUS (billing/exports/focus.py): the FinOps Open Cost and Usage Specification 1.0, one row per cost
line and billing month (docs/billing.md "The FOCUS columns" maps each column).
"""

from __future__ import annotations

import csv
import io
from collections.abc import Callable, Iterable, Iterator, Sequence
from datetime import UTC, datetime
from decimal import Decimal
from fractions import Fraction
from typing import IO, Any

from django.conf import settings
from openpyxl import Workbook
from openpyxl.cell import WriteOnlyCell
from openpyxl.styles import Font

from billing.exports import focus
from billing.rates.rating import QUANTITY_PLACES
from billing.selectors import (
    CostRow,
    aggregate_per_cluster,
    cost_lines_visible,
    line_filter_for,
    totals,
)
from common.text import csv_safe

FORMATS = ("csv", "xlsx", "focus")
CONTENT_TYPES = {
    "csv": "text/csv; charset=utf-8",
    "xlsx": "application/vnd.openxmlformats-officedocument.spreadsheetml.sheet",
    "focus": "text/csv; charset=utf-8",
}
EXTENSIONS = {"csv": "csv", "xlsx": "xlsx", "focus": "focus.csv"}
# The progress callback hears about every this many rows (and the last one): often enough
# for a progress bar, rarely enough that saving the count costs little beside the rows.
PROGRESS_EVERY = 500

Progress = Callable[[int, int], None]


def export_write(
    *,
    user: Any,
    fmt: str,
    query: dict[str, Any],
    out: IO[bytes],
    progress: Progress | None = None,
) -> int:
    """Write the export of `query` (the cost API's validated query: `from`, `to`, `by`, and
    the filters `tenant`, `project`, `flavor`, `kind`) as `user` may see it, to `out`.

    `fmt`: "csv" and "xlsx" hold one row per value of `by` and cluster, and a totals row;
    "focus" one row per cost line (no totals row: FOCUS datasets have none). Returns the rows
    written, the header and totals row left out. `progress(done, total)` is called as rows
    are written.
    DomainError when a flavor used has no rate (as the cost API)."""
    if fmt not in FORMATS:
        raise ValueError(f"unknown export format {fmt!r}")
    if fmt == "focus":
        # Rated per billing month: each row stands in one (billing/exports/focus.py).
        months = [
            (lo, hi, cost_lines_visible(user, lo, hi, line_filter_for(query)))
            for lo, hi in focus.billing_months(query["from"], query["to"])
        ]
        count = sum(len(lines) for _, _, lines in months)
        return write_csv(list(focus.COLUMNS), focus.rows(months), out, count, progress)
    lines = cost_lines_visible(user, query["from"], query["to"], line_filter_for(query))
    window = (query["from"], query["to"])
    rows = aggregate_per_cluster(lines, query["by"])
    table = CostTable(query["by"], window, rows, totals(lines))
    if fmt == "csv":
        return write_csv(
            table.header(),
            table.csv_rows(),
            out,
            len(rows),
            progress,
            footer=table.csv_total(),
            bom=True,
        )
    return write_xlsx(table, out, progress)


def _report(progress: Progress | None, done: int, total: int) -> None:
    if progress is not None and (done % PROGRESS_EVERY == 0 or done == total):
        progress(done, total)


# --- CSV ------------------------------------------------------------------------------------


def write_csv(
    header: Sequence[str],
    rows: Iterable[Sequence[Any]],
    out: IO[bytes],
    total: int,
    progress: Progress | None = None,
    *,
    footer: Sequence[Any] | None = None,
    bom: bool = False,
) -> int:
    """`header`, `rows` (cells already escaped, or numbers) and `footer` as CSV, row by row;
    the rows written, header and footer left out. `bom`: a UTF-8 byte order mark first, which
    spreadsheets need to read UTF-8 names right."""
    text = io.TextIOWrapper(out, encoding="utf-8-sig" if bom else "utf-8", newline="")
    try:
        writer = csv.writer(text)
        writer.writerow(header)
        if progress is not None:
            progress(0, total)
        written = 0
        for row in rows:
            writer.writerow(row)
            written += 1
            _report(progress, written, total)
        if footer is not None:
            writer.writerow(footer)
        text.flush()
    finally:
        text.detach()  # the caller's stream stays open
    return written


# --- the aggregated table (CSV and XLSX) ---------------------------------------------------


def _money(value: Decimal) -> Decimal:
    return value.quantize(Decimal("0.01"))


def _hours(value: Fraction) -> Decimal:
    shown = Decimal(value.numerator) / Decimal(value.denominator)
    return shown.quantize(QUANTITY_PLACES)


def _utc(moment: datetime) -> str:
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class CostTable:
    """The cost API's page as a table: one row per value of `by` and cluster, then the
    totals. Beside `by`, a `cluster` column (the rows' `CostRow.cluster`); by "cluster"
    itself, its `cluster` column is `by`'s own."""

    def __init__(
        self,
        by: str,
        window: tuple[datetime, datetime],
        rows: list[CostRow],
        total: CostRow,
    ) -> None:
        self.by = by
        self.window = window
        self.rows = rows
        self.total = total
        self.currency = settings.GANTRY_BILLING_CURRENCY
        self.cluster_column = by != "cluster"

    def header(self) -> list[str]:
        return [
            "from",
            "to",
            f"{self.by}_id",
            self.by,
            *(["cluster"] if self.cluster_column else []),
            f"charged_{self.currency}",
            f"showback_{self.currency}",
            "gpu_hours_used",
            "gpu_hours_idle_reserved",
        ]

    def cells(self, row: CostRow, text: Callable[[Any], str] = csv_safe) -> tuple[Any, ...]:
        """(key, name, [cluster,] charged, showback, GPU-hours used, idle reserved GPU-hours);
        text through `text` (CSV: escaped against formulas)."""
        key = "" if row.key is None else text(row.key)
        return (
            key,
            text(row.name),
            *([text(row.cluster or "")] if self.cluster_column else []),
            _money(row.charged),
            _money(row.showback),
            _hours(row.gpu_hours_used),
            _hours(row.gpu_hours_idle_reserved),
        )

    def csv_rows(self) -> Iterator[list[Any]]:
        start, end = (_utc(moment) for moment in self.window)
        for row in self.rows:
            yield [start, end, *self.cells(row)]

    def csv_total(self) -> list[Any]:
        start, end = (_utc(moment) for moment in self.window)
        return [start, end, "", *self.total_cells()]

    def total_cells(self) -> tuple[Any, ...]:
        """("Total", [cluster: "",] charged, showback, GPU-hours used, idle reserved)."""
        total = self.total
        used, idle = _hours(total.gpu_hours_used), _hours(total.gpu_hours_idle_reserved)
        blank = ("",) if self.cluster_column else ()
        return ("Total", *blank, total.charged, total.showback, used, idle)


def _as_typed(value: Any) -> str:
    """A name as it was typed ("" for none): XLSX keeps it in a text cell, no escaping."""
    return "" if value is None else str(value)


# --- XLSX -----------------------------------------------------------------------------------

DATE_FORMAT = "yyyy-mm-dd hh:mm"
HOURS_FORMAT = "0.000000"


def write_xlsx(table: CostTable, out: IO[bytes], progress: Progress | None = None) -> int:
    """The table as one sheet: a bold header, typed cells (dates, amounts with the currency's
    number format, GPU-hours as numbers), and a bold totals row of values (not formulas: the
    figure is the cost API's total, readable without recalculation).

    Names are text cells holding the name as typed: no CSV apostrophe, and never a formula
    (openpyxl makes a string starting with `=` a formula unless the cell is typed text; the
    quote prefix keeps a spreadsheet from reading it as one when the cell is edited)."""
    book = Workbook(write_only=True)
    sheet = book.create_sheet(title="Costs")
    money = f'#,##0.00 "{table.currency}"'
    bold = Font(bold=True)

    def cell(value: Any, number_format: str | None = None, font: Font | None = None) -> Any:
        made = WriteOnlyCell(sheet, value=value)
        if number_format:
            made.number_format = number_format
        if font is not None:
            made.font = font
        return made

    def text(value: str) -> Any:
        made = cell(value)
        made.data_type = "s"
        if value != csv_safe(value):  # would be read as a formula
            made.quotePrefix = True
        return made

    header = [
        "From (UTC)",
        "To (UTC)",
        f"{table.by} id",
        table.by,
        *(["cluster"] if table.cluster_column else []),
        "Charged",
        "Showback",
    ]
    titles = [*header, "GPU-hours used", "Idle reserved GPU-hours"]
    sheet.append([cell(title, font=bold) for title in titles])
    # openpyxl refuses aware datetimes: the window in UTC, said so in the header.
    start, end = (moment.astimezone(UTC).replace(tzinfo=None) for moment in table.window)
    total = len(table.rows)
    if progress is not None:
        progress(0, total)
    for written, row in enumerate(table.rows, start=1):
        key, name, *where, charged, showback, used, idle = table.cells(row, _as_typed)
        sheet.append(
            [
                cell(start, DATE_FORMAT),
                cell(end, DATE_FORMAT),
                cell(row.key) if isinstance(row.key, int) else text(key),
                text(name),
                *(text(value) for value in where),
                cell(charged, money),
                cell(showback, money),
                cell(used, HOURS_FORMAT),
                cell(idle, HOURS_FORMAT),
            ]
        )
        _report(progress, written, total)
    label, *where, charged, showback, used, idle = table.total_cells()
    sheet.append(
        [
            cell(start, DATE_FORMAT, bold),
            cell(end, DATE_FORMAT, bold),
            cell(None),
            cell(label, font=bold),
            *(cell(None) for _ in where),
            cell(charged, money, bold),
            cell(showback, money, bold),
            cell(used, HOURS_FORMAT, bold),
            cell(idle, HOURS_FORMAT, bold),
        ]
    )
    book.save(out)
    return total


# --- queries kept for later (the Celery path) -----------------------------------------------


def query_to_json(query: dict[str, Any]) -> dict[str, Any]:
    """A validated query as JSON, to run later: instants as ISO 8601 UTC."""
    return {
        key: _utc(value) if isinstance(value, datetime) else value for key, value in query.items()
    }


def query_from_json(data: dict[str, Any]) -> dict[str, Any]:
    """The inverse of `query_to_json` (the query was validated when it was stored)."""
    out = dict(data)
    for key in ("from", "to"):
        out[key] = datetime.fromisoformat(data[key].replace("Z", "+00:00"))
    return out


def filename(fmt: str, query: dict[str, Any]) -> str:
    """gantry-costs-<by>-<from>-<to>.<ext>, from the validated query."""
    start, end = (query[k].astimezone(UTC).strftime("%Y%m%dT%H") for k in ("from", "to"))
    by = "lines" if fmt == "focus" else query["by"]
    return f"gantry-costs-{by}-{start}-{end}.{EXTENSIONS[fmt]}"
