"""A dashboard with one utilization window draws it (issue 35): a line needs two points, so
a series of one point (a new cluster's first window) gets markers instead of blank axes."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.urls import reverse
from django.utils import timezone

from portal.dashboard_charts import _mode
from scheduler.models import Allocation, GpuDevice, JobState
from scheduler.telemetry.rollups import floor_to, rollup_run
from scheduler.telemetry.samples import DeviceReading, samples_ingest
from tests.billing.builders import hold, job_for, make_node
from tests.conftest import Org
from tests.portal.test_dashboards import figures

pytestmark = pytest.mark.django_db


def one_window(org: Org) -> Any:
    """team-alpha's job on one H100, sampled in a single 5-minute window, rolled up."""
    start = floor_to(timezone.now() - timedelta(minutes=15), timedelta(minutes=5))
    node = make_node("n1", gpus=1)
    job = job_for(org, state=JobState.RUNNING, name="first-job", started_at=start)
    hold(job, node, -3, None, [1000])
    Allocation.objects.filter(job=job).update(started_at=start)
    device = GpuDevice.objects.get(node=node)
    samples_ingest([DeviceReading(device.id, 70.0, memory_used_mib=4000)], at=start)
    while rollup_run(now=start + timedelta(minutes=7)):
        pass
    return job


def drawn_alone(figure: dict[str, Any]) -> list[str]:
    """The names of the figure's one-point series that draw nothing (no markers)."""
    return [
        trace["name"]
        for trace in figure["data"]
        if trace.get("type") == "scatter"
        and len(set(map(str, trace["x"]))) < 2
        and "markers" not in trace.get("mode", "")
    ]


def test_one_window_draws_on_the_cluster_tenant_and_job_charts(org: Org, web_for: Any) -> None:
    job = one_window(org)
    cluster = figures(web_for("pat").get(reverse("portal:dashboard-cluster")).content.decode())
    tenant_url = reverse("portal:tenant-dashboard", kwargs={"pk": org.alpha.pk})
    tenant = figures(web_for("alice").get(tenant_url).content.decode())
    job_url = reverse("portal:job-detail", kwargs={"pk": job.pk})
    job_page = figures(web_for("alice").get(job_url).content.decode())
    drawn = {
        "cluster capacity": cluster["figure-capacity"],
        "tenant usage": tenant["figure-usage"],
        "job utilization": job_page["figure-job-utilization"],
    }
    for chart, figure in drawn.items():
        points = [trace for trace in figure["data"] if len(trace["x"]) == 1]
        assert points, f"{chart}: expected series of the one window"
        assert drawn_alone(figure) == [], chart
        assert all("markers" in trace["mode"] for trace in points), chart


@pytest.mark.parametrize(
    ("x", "y", "mode"),
    [
        ([1, 2, 3], [5, 6, 7], "lines"),
        ([1], [5], "lines+markers"),  # one window
        ([1, 1], [8, 8], "lines+markers"),  # a guarantee drawn over one window
        ([1, 2, 3], [5, None, 7], "lines+markers"),  # points alone between gaps
        ([1, 2, 3], [5, 6, None], "lines"),  # a gap at the end leaves a line
        ([], [], "lines+markers"),  # nothing: no line either way
    ],
    ids=["line", "one-point", "same-time", "isolated-by-gaps", "trailing-gap", "empty"],
)
def test_a_series_gets_markers_where_a_line_cannot_draw(x: Any, y: Any, mode: str) -> None:
    assert _mode(x, y) == mode
