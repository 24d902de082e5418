"""Plotly figures of the dashboards (cluster, tenant, job), from scheduler/telemetry/dashboards.py.

As the cost charts (portal/charts.py): built on the server, sent as JSON (`json_script`) and
drawn by portal/static/portal/charts.js with the plotly.js of the installed package. A chart
whose series are all empty gets no figure: the page says there is no data instead of
drawing empty axes. The tables under each chart carry the same figures.
"""

from __future__ import annotations

from typing import Any

import plotly.graph_objects as go

from portal.charts import COLOURS, _as_json
from scheduler.telemetry.dashboards import CapacityPoint, ClusterDashboard, TenantDashboard
from scheduler.telemetry.job_dashboard import JobUtilization


def _layout(title: str, unit: str, **extra: Any) -> dict[str, Any]:
    return {
        "title": {"text": title},
        "template": "none",
        "colorway": COLOURS,
        "yaxis": {"title": {"text": unit}, "rangemode": "tozero"},
        "margin": {"l": 60, "r": 20, "t": 40, "b": 60},
        "height": 320,
        "legend": {"orientation": "h", "y": -0.2},
        **extra,
    }


def _line(name: str, x: list[Any], y: list[Any], **extra: Any) -> go.Scatter:
    return go.Scatter(name=name, x=x, y=y, mode=_mode(x, y), **extra)


def _mode(x: list[Any], y: list[Any]) -> str:
    """A line needs two points: a series of one window (a new cluster's first, or one
    between gaps) or with all its points at one time would draw nothing, so those get
    markers as well."""
    if len(set(x)) < 2:
        return "lines+markers"
    for i, value in enumerate(y):
        before = i > 0 and y[i - 1] is not None
        after = i + 1 < len(y) and y[i + 1] is not None
        if value is not None and not (before or after):
            return "lines+markers"
    return "lines"


def _figure(traces: list[Any], layout: dict[str, Any]) -> Any:
    return _as_json(go.Figure(traces, layout=layout)) if traces else None


def cluster_figures(dash: ClusterDashboard) -> dict[str, Any]:
    """chart id -> figure (None when the chart has no data in the range)."""
    capacity = []
    for flavor, points in dash.capacity.items():
        x = [p.start for p in points]
        capacity.append(_line(f"{flavor} allocated", x, [p.allocated for p in points]))
        capacity.append(_line(f"{flavor} used", x, [p.used for p in points], line={"dash": "dot"}))
    queue_x = [p.start for p in dash.queue]
    queue = (
        [_line("queued jobs", queue_x, [p.queued_jobs for p in dash.queue])] if dash.queue else []
    )
    admitted = [p for p in dash.queue if p.admissions]
    waits = (
        [
            _line("mean wait", [p.start for p in admitted], [p.wait_mean_s for p in admitted]),
            _line(
                "p95 wait (bucket bound)",
                [p.start for p in admitted],
                [None if p.wait_p95_s == float("inf") else p.wait_p95_s for p in admitted],
                line={"dash": "dot"},
            ),
        ]
        if admitted
        else []
    )
    fragmentation = []
    for flavor, frag in dash.fragmentation.items():
        x = [p.start for p in frag]
        fragmentation.append(_line(f"{flavor} free", x, [p.free for p in frag]))
        fragmentation.append(_line(f"{flavor} fragmented", x, [p.fragmented for p in frag]))
    failures = (
        [go.Bar(name="failures", x=[r for r, _ in dash.failures], y=[n for _, n in dash.failures])]
        if dash.failures
        else []
    )
    idle = (
        [
            go.Bar(
                name="idle GPU-hours",
                x=[f"{row.name} #{row.job_id}" for row in dash.idle],
                y=[row.idle_gpu_hours for row in dash.idle],
            )
        ]
        if dash.idle
        else []
    )
    return {
        "capacity": _figure(capacity, _layout("Allocated and used GPUs per flavor", "GPUs")),
        "queue": _figure(queue, _layout("Jobs waiting in the queue", "jobs")),
        "waits": _figure(waits, _layout("Time to admission", "seconds")),
        "fragmentation": _figure(
            fragmentation, _layout("Free and fragmented GPUs per flavor", "GPUs")
        ),
        "failures": _figure(
            failures, _layout("Failures by reason", "events", xaxis={"type": "category"})
        ),
        "idle": _figure(
            idle, _layout("Most idle allocations", "idle GPU-hours", xaxis={"type": "category"})
        ),
    }


def cluster_history_figure(history: dict[str, list[CapacityPoint]]) -> Any:
    """Allocated and (dotted) used GPUs per cluster (the Clusters page); None without data."""
    lines = []
    for cluster, points in history.items():
        x = [p.start for p in points]
        lines.append(_line(f"{cluster} allocated", x, [p.allocated for p in points]))
        lines.append(_line(f"{cluster} used", x, [p.used for p in points], line={"dash": "dot"}))
    return _figure(lines, _layout("Allocated and used GPUs per cluster", "GPUs"))


def tenant_figures(dash: TenantDashboard) -> dict[str, Any]:
    usage, borrowing = [], []
    for flavor, points in dash.usage.items():
        x = [p.start for p in points]
        usage.append(_line(f"{flavor} used", x, [p.used for p in points]))
        quota = dash.quotas.get(flavor)
        if quota is not None and x:
            edges = [x[0], x[-1]]
            usage.append(
                _line(f"{flavor} guarantee", edges, [quota.guaranteed] * 2, line={"dash": "dash"})
            )
            usage.append(_line(f"{flavor} limit", edges, [quota.limit] * 2, line={"dash": "dot"}))
        borrowing.append(_line(f"{flavor} borrowed", x, [p.borrowed for p in points]))
        borrowing.append(_line(f"{flavor} lent (unused guarantee)", x, [p.lent for p in points]))
    idle_x = [start for start, _, _ in dash.idle]
    idle = (
        [
            _line("GPUs held", idle_x, [held for _, held, _ in dash.idle]),
            _line("of them idle", idle_x, [i for _, _, i in dash.idle], fill="tozeroy"),
        ]
        if dash.idle
        else []
    )
    admitted = [p for p in dash.queue if p.admissions]
    waits = (
        [_line("mean wait", [p.start for p in admitted], [p.wait_mean_s for p in admitted])]
        if admitted
        else []
    )
    return {
        "usage": _figure(usage, _layout("Usage against guarantee and limit", "GPUs")),
        "borrowing": _figure(borrowing, _layout("Borrowed and lent GPUs", "GPUs")),
        "idle": _figure(idle, _layout("Held and idle GPUs", "GPUs")),
        "waits": _figure(waits, _layout("Its jobs' time to admission", "seconds")),
    }


def job_figure(util: JobUtilization) -> Any:
    """One utilization line per device the job held (solid) and its memory (dashed, right
    axis), in the same colour: a device is one legend group."""
    traces: list[Any] = []
    for number, device in enumerate(util.devices):
        x = [p.start for p in device.points]
        colour = {"color": COLOURS[number % len(COLOURS)]}
        group = {"legendgroup": device.label}
        traces.append(
            _line(
                f"{device.label} %",
                x,
                [p.utilization_mean for p in device.points],
                line=colour,
                **group,
            )
        )
        traces.append(
            _line(
                f"{device.label} MiB",
                x,
                [p.memory_mib for p in device.points],
                yaxis="y2",
                line={**colour, "dash": "dash"},
                **group,
            )
        )
    layout = _layout(
        "Utilization and memory of each of its GPUs",
        "utilization %",
        yaxis2={
            "title": {"text": "memory used, MiB"},
            "overlaying": "y",
            "side": "right",
            "rangemode": "tozero",
        },
        margin={"l": 60, "r": 80, "t": 40, "b": 60},  # room for the memory axis on the right
    )
    return _figure(traces, layout)
