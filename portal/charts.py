"""Plotly figures of the cost charts, built on the server from billing/costs/charts.py.

The figures travel as JSON (`json_script`, data, never run as script) and are drawn by
portal/static/portal/charts.js with the plotly.js of the installed plotly package
(portal/staticfinders.py). Amounts go to plotly as floats for drawing only: the tables beside
each chart carry the exact decimal figures.
"""

from __future__ import annotations

import json
from typing import Any

import plotly.graph_objects as go

from billing.budgets.burn_down import BurnDown
from billing.costs.charts import CostCharts
from billing.models import BudgetUnit

NO_DEPARTMENT = "(no department)"
NO_FLAVOR = "(adjustments)"
# Colours distinguishable with the common colour blindnesses (Okabe and Ito's palette).
COLOURS = ["#0072B2", "#E69F00", "#009E73", "#CC79A7", "#56B4E9", "#D55E00", "#F0E442", "#000000"]


def _layout(title: str, currency: str, **extra: Any) -> dict[str, Any]:
    return {
        "title": {"text": title},
        "template": "none",
        "colorway": COLOURS,
        "yaxis": {"title": {"text": currency}, "rangemode": "tozero"},
        "margin": {"l": 60, "r": 20, "t": 40, "b": 60},
        "height": 340,
        "legend": {"orientation": "h", "y": -0.2},
        **extra,
    }


def _as_json(figure: go.Figure) -> Any:
    return json.loads(figure.to_json())


def department_label(name: str | None) -> str:
    return name if name is not None else NO_DEPARTMENT


def flavor_label(name: str | None) -> str:
    return name if name else NO_FLAVOR


def figures(charts: CostCharts) -> dict[str, Any]:
    """chart id -> the plotly figure (JSON-ready), one per chart that has figures."""
    out: dict[str, Any] = {}
    if charts.departments:
        out["departments"] = _as_json(
            go.Figure(
                [
                    go.Bar(
                        name=department_label(series.name),
                        x=charts.months,
                        y=[None if amount is None else float(amount) for amount in series.amounts],
                    )
                    for series in charts.departments
                ],
                layout=_layout(
                    "Charged cost by department per month",
                    charts.currency,
                    barmode="stack",
                    xaxis={"type": "category"},
                ),
            )
        )
    if charts.flavors:
        out["flavors"] = _as_json(
            go.Figure(
                [
                    go.Bar(
                        name="charged",
                        x=[flavor_label(row.name) for row in charts.flavors],
                        y=[float(row.charged) for row in charts.flavors],
                    ),
                    go.Bar(
                        name="showback",
                        x=[flavor_label(row.name) for row in charts.flavors],
                        y=[float(row.showback) for row in charts.flavors],
                    ),
                ],
                layout=_layout(
                    f"Cost per flavor, {charts.months[-1]}",
                    charts.currency,
                    barmode="stack",
                    xaxis={"type": "category"},
                ),
            )
        )
    if charts.idle:
        out["idle"] = _as_json(
            go.Figure(
                [
                    go.Bar(
                        name="charged",
                        x=[row.name for row in charts.idle],
                        y=[float(row.charged) for row in charts.idle],
                    ),
                    go.Bar(
                        name="showback",
                        x=[row.name for row in charts.idle],
                        y=[float(row.showback) for row in charts.idle],
                    ),
                ],
                layout=_layout(
                    f"Idle reserved cost per tenant, {charts.months[-1]}",
                    charts.currency,
                    barmode="stack",
                    xaxis={"type": "category"},
                ),
            )
        )
    return out


def burn_down_figure(burn_down: BurnDown) -> Any:
    """Spent by the end of each day against the limit, for one budget."""
    position = burn_down.position
    unit = position.currency if position.unit == BudgetUnit.MONEY else "GPU-hours"
    days = [day.isoformat() for day in burn_down.days]
    return _as_json(
        go.Figure(
            [
                go.Scatter(
                    name="spent",
                    x=days,
                    y=[None if value is None else float(value) for value in burn_down.spent],
                    mode="lines+markers",
                ),
                go.Scatter(
                    name="limit",
                    x=[days[0], days[-1]],
                    y=[float(position.limit)] * 2,
                    mode="lines",
                    line={"dash": "dash"},
                ),
            ],
            layout=_layout(
                f"Budget of {burn_down.tenant.slug}, {position.month:%Y-%m}",
                unit,
                xaxis={"type": "date"},
            ),
        )
    )


def drawn_burn_downs(burn_downs: list[BurnDown]) -> list[dict[str, Any]]:
    """What the template draws of each burn-down: its figures, table rows and figure."""
    return [
        {
            "tenant": burn_down.tenant,
            "position": burn_down.position,
            "rows": burn_down.rows,
            "figure": burn_down_figure(burn_down),
            "figure_id": f"figure-budget-{burn_down.position.budget_id}",
        }
        for burn_down in burn_downs
    ]
