"""The figures of the portal's cost charts, from the cost API's lines (billing/selectors.py).

Every figure is the cost API's for the same window and the same viewer: the lines are
`cost_lines_visible`'s (so a tenant admin's charts hold their subtree only) and are added up
by the API's own `aggregate`. Each month's lines are rated once per request and shared by
every chart and table of the page.

- Cost by department per month: the charged amounts `GET /api/v1/costs/?by=department`
  gives for each of the last `months` months (the one shown included).
- Cost per flavor: `?by=flavor` for the month shown.
- Idle reserved cost per tenant: the `idle-reserved` lines of the month shown, added up on
  the tenant each is written to (the one holding the guarantee, or, under the `spread`
  policy, the users' tenants), charged and showback apart.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal
from typing import Any

from billing.costs.lines import CostLine
from billing.models import LineKind
from billing.periods import month_end, month_starts
from billing.selectors import CostRow, LineFilter, aggregate, cost_lines_visible
from billing.statements.rollup import SplitsMemo
from common.errors import DomainError
from tenants.models import Tenant

CHART_MONTHS = 6


@dataclass(frozen=True)
class Series:
    """One department's charged cost in each month of the chart (None: no department)."""

    key: Any  # the department's id, None for costs outside every department
    name: str | None
    amounts: list[Decimal | None]  # None: the month cannot be priced

    @property
    def total(self) -> Decimal:
        return sum((a for a in self.amounts if a is not None), Decimal("0.00"))


@dataclass(frozen=True)
class CostCharts:
    currency: str
    months: list[str]  # "2031-01", oldest first; the last is the month shown
    departments: list[Series]
    flavors: list[CostRow]
    idle: list[CostRow]
    unpriced: list[str]  # months that cannot be priced (a flavor used without a rate card)

    @property
    def month_totals(self) -> list[Decimal | None]:
        return [
            None
            if month in self.unpriced
            else sum((s.amounts[i] or Decimal(0) for s in self.departments), Decimal("0.00"))
            for i, month in enumerate(self.months)
        ]

    @property
    def empty(self) -> bool:
        return not (self.departments or self.flavors or self.idle)


def visible_month_lines(
    user: Any,
    last: datetime,
    top: Tenant | None = None,
    months: int = CHART_MONTHS,
    *,
    splits: SplitsMemo | None = None,
) -> dict[datetime, list[CostLine] | None]:
    """month start -> the lines of that month the user may see (under `top`), rated once;
    None for an earlier month that cannot be priced (a flavor used without a rate card then),
    so the month shown is not lost to an old gap. DomainError when the last month cannot."""
    out: dict[datetime, list[CostLine] | None] = {}
    for start in month_starts(last, months):
        try:
            out[start] = cost_lines_visible(
                user, start, month_end(start), LineFilter(tenant=top), splits=splits
            )
        except DomainError:
            if start == month_starts(last, 1)[0]:
                raise
            out[start] = None
    return out


def _idle_by_tenant(lines: list[CostLine]) -> list[CostRow]:
    idle = [line for line in lines if line.kind == LineKind.IDLE_RESERVED]
    tenants = Tenant.objects.filter(pk__in={line.tenant for line in idle})
    names = dict(tenants.values_list("id", "slug"))
    rows: dict[int, CostRow] = {}
    for line in idle:
        row = rows.setdefault(line.tenant, CostRow(line.tenant, names[line.tenant]))
        if line.charged:
            row.charged += line.amount
        else:
            row.showback += line.amount
        row.gpu_hours += line.gpu_hours
    return sorted(rows.values(), key=lambda r: (-(r.charged + r.showback), str(r.name)))


def cost_charts(currency: str, month_lines: dict[datetime, list[CostLine] | None]) -> CostCharts:
    """The three charts' figures from each month's lines (the last month: the one shown; a
    month without lines (None) cannot be priced, and has no figures)."""
    starts = sorted(month_lines)
    per_month = [
        None
        if month_lines[start] is None
        else {row.key: row for row in aggregate(month_lines[start] or [], "department")}
        for start in starts
    ]
    keys: dict[Any, str | None] = {}
    for rows in per_month:
        for row in (rows or {}).values():
            keys.setdefault(row.key, row.name)
    departments = [
        Series(
            key,
            name,
            [
                None if rows is None else rows[key].charged if key in rows else Decimal("0.00")
                for rows in per_month
            ],
        )
        for key, name in keys.items()
    ]
    departments.sort(key=lambda s: (-s.total, s.name is None, str(s.name)))
    shown = (month_lines[starts[-1]] or []) if starts else []
    return CostCharts(
        currency=currency,
        months=[f"{start:%Y-%m}" for start in starts],
        unpriced=[f"{start:%Y-%m}" for start in starts if month_lines[start] is None],
        departments=departments,
        flavors=aggregate(shown, "flavor"),
        idle=_idle_by_tenant(shown),
    )
