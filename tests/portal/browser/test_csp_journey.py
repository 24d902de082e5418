"""The Content-Security-Policy breaks nothing a browser runs (issue 34, item 8): the portal's
charts (plotly.js) and htmx, and the API's docs page (Swagger UI, served offline), draw with
no violation reported."""

from __future__ import annotations

from typing import Any

import pytest
from playwright.sync_api import expect

from tests.conftest import Org
from tests.portal.test_dashboards import build_history

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

SLOW = 60_000  # plotly.js (4.8 MB) into a fresh browser context on a loaded machine


def violations(page: Any) -> list[str]:
    """Every CSP violation and console error the page reports from now on."""
    seen: list[str] = []
    page.on("console", lambda m: seen.append(m.text) if m.type == "error" else None)
    page.on("pageerror", lambda e: seen.append(str(e)))
    return seen


def test_charts_htmx_and_the_api_docs_run_under_the_policy(org: Org, page_for: Any) -> None:
    build_history(org)
    pat = page_for("pat")
    seen = violations(pat)
    pat.click("nav >> text=Cluster")
    expect(pat.locator("#chart-capacity svg.main-svg").first).to_be_visible(timeout=SLOW)
    pat.goto("/api/v1/docs/")
    expect(pat.locator(".swagger-ui .info .title")).to_contain_text("Gantry API", timeout=SLOW)
    expect(pat.locator(".opblock").first).to_be_visible()
    assert not seen, seen
