"""Browser journey of issue 20's dashboards: a platform admin's cluster dashboard draws its
plotly charts (from the plotly.js the portal serves) with the figures in their tables; a
member's tenant dashboard and job page draw theirs. Screenshots go to GANTRY_SCREENSHOTS_DIR
when it is set (`GANTRY_SCREENSHOTS_DIR=docs/screenshots pytest tests/portal/browser/
test_dashboards_journey.py`), else to a temporary folder."""

from __future__ import annotations

from typing import Any

import pytest
from playwright.sync_api import expect

from tests.conftest import Org
from tests.portal.browser.conftest import shoot
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
    shoot(pat, "dashboard-cluster")
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
    shoot(alice, "dashboard-tenant")
    alice.goto(f"/jobs/{history['alpha'].pk}/")
    drawn(alice, "job-utilization")
    shoot(alice, "job-utilization")
