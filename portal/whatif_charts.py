"""The plotly figure of a what-if's result page: waits per tenant, today beside proposed.

From the viewer's results (`whatif.present.results_for`), plain data; drawn by
portal/static/portal/charts.js like the cost charts. The table beside it has the figures.
"""

from __future__ import annotations

import json
from typing import Any

import plotly.graph_objects as go

from portal.charts import COLOURS

SIDES = (("baseline", "today"), ("proposed", "proposed"))


def wait_figure(results: dict[str, Any]) -> dict[str, Any] | None:
    """Grouped bars of the mean and p90 wait (hours) per tenant row, or None with no waits."""
    rows = [r for r in results["tenants"] if any(r[s]["started"] for s, _ in SIDES)]
    if not rows:
        return None
    names = [r["tenant"] for r in rows]
    bars = []
    for measure, label in (("mean_wait_s", "mean"), ("p90_wait_s", "p90")):
        for side, side_label in SIDES:
            hours = [(r[side][measure] or 0.0) / 3600 for r in rows]
            bars.append(go.Bar(name=f"{label} wait, {side_label}", x=names, y=hours))
    figure = go.Figure(
        bars,
        layout={
            "title": {"text": "Wait to first start per tenant"},
            "template": "none",
            "colorway": COLOURS,
            "barmode": "group",
            "yaxis": {"title": {"text": "hours"}, "rangemode": "tozero"},
            "margin": {"l": 60, "r": 20, "t": 40, "b": 60},
            "height": 340,
            "legend": {"orientation": "h", "y": -0.2},
        },
    )
    out: dict[str, Any] = json.loads(figure.to_json())
    return out
