"""Browser journey of issue 18's portal: finance opens the costs page, the plotly charts draw
(from the plotly.js the portal serves) and their tables hold the figures, exports XLSX and
downloads it; a team admin sees only their subtree. Screenshots of the costs pages in a
demo-like state (tests/portal/browser/cost_demo.py) go to GANTRY_SCREENSHOTS_DIR
when it is set: `GANTRY_SCREENSHOTS_DIR=docs/screenshots pytest tests/portal/browser/
test_costs_journey.py` refreshes them (building half a year of metered costs takes a while, so
the screenshot test is skipped otherwise)."""

from __future__ import annotations

import os
from decimal import Decimal
from pathlib import Path
from typing import Any

import openpyxl
import pytest
from playwright.sync_api import expect

from billing.models import CostExport
from tests.billing.test_exports import eager_celery  # noqa: F401 - a fixture
from tests.conftest import Org
from tests.portal.browser.conftest import PHONE, shoot
from tests.portal.browser.cost_demo import build_cost_demo
from tests.portal.test_cost_charts import two_months

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

CHARTS = ("departments", "flavors", "idle")
# The costs pages rate six months and load plotly.js (4.8 MB) into a fresh browser context: on
# a loaded test machine that takes longer than the default 10 s.
SLOW = 60_000


def table_of(page: Any, name: str) -> dict[str, list[str]]:
    """A chart's table as the browser has it: row header -> cells."""
    rows = page.locator(f"#table-{name} tr:has(th[scope=row])")
    return {
        (row.locator("th").text_content() or "").strip(): [
            cell.strip() for cell in row.locator("td").all_text_contents()
        ]
        for row in rows.all()
    }


def charts_drawn(page: Any) -> None:
    for name in CHARTS:
        expect(page.locator(f"#chart-{name} svg.main-svg").first).to_be_visible(timeout=SLOW)


@pytest.mark.usefixtures("eager_celery")
def test_finance_sees_the_charts_and_their_tables_exports_xlsx_a_team_admin_only_their_subtree(
    org: Org, page_for: Any, tmp_path: Path
) -> None:
    two_months(org)
    carol = page_for("carol")
    plotly_requests: list[str] = []
    carol.on("request", lambda r: plotly_requests.append(r.url) if "plotly" in r.url else None)
    carol.goto("/costs/?month=2031-02", timeout=SLOW)
    charts_drawn(carol)
    assert plotly_requests and all(
        url.startswith(carol.context.pages[0].url.split("/costs")[0]) for url in plotly_requests
    ), plotly_requests  # served by the portal, no CDN
    # The table behind each chart: closed until asked for, then the same figures.
    table = carol.locator("#table-departments")
    expect(table).to_be_hidden()
    carol.click("#chart-departments summary")
    expect(table).to_be_visible()
    expect(table.locator("th[scope=row]", has_text="research")).to_be_visible()
    expect(carol.locator("#table-flavors")).to_contain_text("H100-80GB")
    # Another month through the HTMX form: the swapped body's charts are drawn too.
    carol.fill("#costs-month", "2031-01")
    carol.click("form.filters button[type=submit]")
    expect(carol.locator("#costs-charts-title")).to_contain_text("2031-01")
    charts_drawn(carol)
    # Export January (the month shown now) by department as XLSX, wait for it, download it:
    # the same figures as the chart's table.
    months = table_of(carol, "departments")
    assert months["research"][-1] != "0.00"
    carol.select_option("#export-format", "xlsx")
    carol.fill("#export-from", "2031-01-01")
    carol.fill("#export-to", "2031-02-01")
    carol.select_option("#export-by", "department")
    assert not CostExport.objects.exists()  # changing a field starts no export
    carol.click("#cost-exports button[type=submit]")
    link = carol.locator("#cost-export-list a[download]").first
    expect(link).to_be_visible(timeout=SLOW)
    with carol.expect_download() as download:
        link.click()
    assert download.value.suggested_filename.endswith(".xlsx")
    saved = tmp_path / download.value.suggested_filename
    download.value.save_as(saved)
    sheet = openpyxl.load_workbook(saved).active
    # (key, name, cluster, charged, ...): the charged column follows the cluster column
    rows = {row[3]: row[5] for row in sheet.iter_rows(min_row=2, values_only=True)}
    for name in ("research", "product", "Total"):
        assert rows[name] == Decimal(months[name][-1]), name

    tina = page_for("tina")  # admin of team-alpha
    tina.goto("/costs/?month=2031-02", timeout=SLOW)
    charts_drawn(tina)
    content = tina.content()
    for other in ("product", "team-charlie", "team-bravo"):
        assert other not in content, other
    expect(tina.locator("#costs-by-tenant")).to_contain_text("team-alpha")


@pytest.mark.skipif(
    not os.environ.get("GANTRY_SCREENSHOTS_DIR"),
    reason="builds half a year of metered costs: run with GANTRY_SCREENSHOTS_DIR=docs/screenshots",
)
def test_screenshots_of_the_cost_pages_in_a_demo_like_state(page_for: Any) -> None:
    demo = build_cost_demo()
    fiona = page_for("fiona")  # finance: the home page leads with the charts
    charts_drawn(fiona)
    expect(fiona.locator("#chart-budget-research svg.main-svg").first).to_be_visible()
    shoot(fiona, "costs-home-finance")
    fiona.goto("/costs/", timeout=SLOW)
    charts_drawn(fiona)
    for name in CHARTS:
        fiona.click(f"#chart-{name} summary")
    shoot(fiona, "costs-finance")
    rita = page_for("rita")  # admin of the research department
    rita.goto("/costs/", timeout=SLOW)
    charts_drawn(rita)
    mine = rita.locator("#costs-charts").inner_text().lower()
    assert "product" not in mine and "assist" not in mine
    shoot(rita, "costs-department-admin")
    ana = page_for("ana", viewport=PHONE)  # the member whose job runs
    ana.goto(f"/jobs/{demo.running.pk}/")
    expect(ana.locator("#job-cost-estimate")).to_be_visible()
    shoot(ana, "job-cost-so-far-phone")
