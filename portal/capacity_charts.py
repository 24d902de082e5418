"""The plotly figure of the capacity page: one pool's (or subtree's) daily demand history and
its forecast band, beside the seasonal-naive baseline and the pool's limit.

From plain data (`capacity.present.PoolPlan`'s lists and days); drawn by
portal/static/portal/charts.js like the cost charts. The tables beside it have the figures.
"""

from __future__ import annotations

import json
from datetime import date, timedelta
from typing import Any

import plotly.graph_objects as go

from portal.charts import COLOURS


def _days(first: date, count: int) -> list[str]:
    return [(first + timedelta(days=i)).isoformat() for i in range(count)]


def forecast_figure(
    *,
    first_day: date,
    last_day: date,
    history: dict[str, list[float]],
    band: dict[str, list[float]],
    limit: float | None,
) -> dict[str, Any]:
    """History lines (requested, allocated, used), the p10..p90 band with its p50, the
    baseline dashed, and the limit (GPU-hours a day at the target utilization) if known."""
    past = _days(first_day, len(history["requested"]))
    ahead = _days(last_day + timedelta(days=1), len(band["p50"]))
    traces = [
        go.Scatter(x=past, y=history[name], name=f"{name}", mode="lines")
        for name in ("requested", "allocated", "used")
    ]
    traces += [
        go.Scatter(
            x=ahead, y=band["p90"], name="p90", mode="lines", line={"width": 0}, showlegend=False
        ),
        go.Scatter(
            x=ahead,
            y=band["p10"],
            name="p10..p90",
            mode="lines",
            line={"width": 0},
            fill="tonexty",
            fillcolor="rgba(0,114,178,0.2)",
        ),
        go.Scatter(
            x=ahead,
            y=band["p50"],
            name="forecast p50",
            mode="lines",
            line={"color": COLOURS[0], "width": 2},
        ),
        go.Scatter(
            x=ahead,
            y=band["baseline"],
            name="seasonal naive",
            mode="lines",
            line={"dash": "dot", "color": "#777777"},
        ),
    ]
    if limit is not None:
        traces.append(
            go.Scatter(
                x=[past[0], ahead[-1]],
                y=[limit, limit],
                name="limit at target",
                mode="lines",
                line={"dash": "dash", "color": COLOURS[5]},
            )
        )
    figure = go.Figure(
        traces,
        layout={
            "template": "none",
            "colorway": COLOURS,
            "yaxis": {"title": {"text": "GPU-hours a day"}, "rangemode": "tozero"},
            "margin": {"l": 60, "r": 20, "t": 20, "b": 60},
            "height": 360,
            "legend": {"orientation": "h", "y": -0.2},
        },
    )
    out: dict[str, Any] = json.loads(figure.to_json())
    return out
