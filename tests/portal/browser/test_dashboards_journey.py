"""Browser journey of issue 20's dashboards: a platform admin's cluster dashboard draws its
plotly charts (from the plotly.js the portal serves) with the figures in their tables; a
member's tenant dashboard and job page draw theirs. Screenshots of the dashboards over a week
of a 64-GPU cluster go to GANTRY_SCREENSHOTS_DIR: `GANTRY_SCREENSHOTS_DIR=docs/screenshots
pytest tests/portal/browser/test_dashboards_journey.py` refreshes them (the screenshot test is
skipped otherwise)."""

from __future__ import annotations

import os
from typing import Any

import pytest
from playwright.sync_api import expect

from tests.conftest import Org
from tests.portal.browser.conftest import SCREENSHOTS, shoot
from tests.portal.test_dashboards import build_history

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

SLOW = 60_000  # plotly.js (4.8 MB) into a fresh browser context on a loaded machine


def drawn(page: Any, chart: str) -> None:
    expect(page.locator(f"#chart-{chart} svg.main-svg").first).to_be_visible(timeout=SLOW)


def test_the_dashboards_draw_their_charts_with_data(org: Org, page_for: Any) -> None:
    history = build_history(org)
    pat = page_for("pat")
    pat.click("nav >> text=Cluster")
    for chart in ("capacity", "queue", "fragmentation", "failures", "idle"):
        drawn(pat, chart)
    # The capacity chart has its two lines, and its table the same figures.
    expect(pat.locator("#chart-capacity .scatterlayer .trace")).to_have_count(2)
    pat.click("#chart-capacity summary")
    expect(pat.locator("#table-capacity tbody tr").first).to_contain_text("H100-80GB")
    expect(pat.locator("#table-idle")).to_contain_text("idle-bravo")
    pat.select_option("#range", "7d")
    pat.click("#range-form button")
    drawn(pat, "capacity")
    expect(pat.locator("p.small.muted").first).to_contain_text("hourly windows")

    alice = page_for("alice")
    alice.click("nav >> text=Usage")
    drawn(alice, "usage")
    drawn(alice, "tenant-idle")
    content = alice.content()
    assert "idle-bravo" not in content and "team-bravo" not in content
    alice.goto(f"/jobs/{history['alpha'].pk}/")
    drawn(alice, "job-utilization")


@pytest.mark.skipif(
    not os.environ.get("GANTRY_SCREENSHOTS_DIR"),
    reason="builds a week of a 64-GPU cluster: run with GANTRY_SCREENSHOTS_DIR=docs/screenshots",
)
def test_screenshots_of_the_dashboards_in_a_demo_like_state(page_for: Any, settings: Any) -> None:
    """A week of a 64-GPU cluster, built as bench/dashboards.py builds its month (the last
    hour through samples_ingest and rollup_run)."""
    from django.utils import timezone

    from bench.dashboards import HOUR, build, ingest, roll_up
    from scheduler.models import Job
    from scheduler.telemetry.rollups import floor_to
    from tests import factories as f

    now = floor_to(timezone.now(), HOUR)
    built = build(64, 7, 1, settings.GANTRY_UTILIZATION_SAMPLE_S, 3, now)
    ingest(built, now, settings.GANTRY_UTILIZATION_SAMPLE_S)
    roll_up(now)
    f.PlatformRoleFactory(user=f.UserFactory(username="pat"), role="platform_admin")
    nlp = built["org"]["nlp"][0]
    f.MembershipFactory(user=f.UserFactory(username="nora"), tenant=nlp, role="member")
    pat = page_for("pat")
    pat.goto("/dashboards/cluster/?range=7d", timeout=SLOW)
    for chart in ("capacity", "queue", "fragmentation", "failures", "idle"):
        drawn(pat, chart)
    shoot(pat, "dashboard-cluster")
    nora = page_for("nora")
    nora.goto(f"/tenants/{nlp.pk}/dashboard/?range=7d", timeout=SLOW)
    drawn(nora, "usage")
    shoot(nora, "dashboard-tenant")
    running = Job.objects.filter(tenant=nlp, state="running").order_by("started_at").first()
    assert running is not None
    nora.goto(f"/jobs/{running.pk}/", timeout=SLOW)
    drawn(nora, "job-utilization")
    # The section alone: the rest of the job's page is other issues' screenshots.
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    nora.locator("#job-utilization").screenshot(path=str(SCREENSHOTS / "job-utilization.png"))
