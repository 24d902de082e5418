"""Finance opens the capacity page, reads the pool's forecast band and the day it is full,
enters the cost of owning and renting H100s, compares buying with renting for an option of
its own, and exports; a department admin sees their subtree only (issue 39). Screenshots of
both."""

from __future__ import annotations

import csv
import io
from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import expect

from tests.capacity.builders import stored_run
from tests.conftest import Org
from tests.portal.browser.conftest import shoot

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]
SLOW = 60_000  # plotly.js (4.8 MB) into a fresh browser context on a loaded machine


def test_finance_compares_buying_with_renting_and_exports(org: Org, page_for: Any) -> None:
    stored_run(org)
    carol = page_for("carol")
    carol.click("nav >> text=Capacity")
    pool = carol.locator("#pool-1")
    expect(pool.locator("h2")).to_have_text("H100-80GB")
    expect(carol.locator("#saturation-1")).to_contain_text("Full on 2026-12-16")
    expect(pool.locator(".chart svg.main-svg").first).to_be_visible(timeout=SLOW)
    expect(pool.locator("table.drivers tbody tr").first).to_contain_text("team-alpha")
    # No TCO yet: the options say when the pool fills, not what they cost.
    expect(pool).to_contain_text("Enter this model's TCO inputs")

    carol.select_option("#tco-form select[name=flavor]", label="H100-80GB")
    for name, value in [
        ("purchase_price", "24000"),
        ("depreciation_months", "36"),
        ("power_cooling_per_gpu_hour", "0.2"),
        ("hosting_support_per_month", "100"),
        ("on_demand_per_gpu_hour", "2.5"),
        ("committed_per_gpu_hour", "1.8"),
    ]:
        carol.fill(f"#tco-form [name={name}]", value)
    carol.click("#tco-form button[type=submit]")
    expect(carol.locator(".flash")).to_contain_text("TCO inputs of H100-80GB saved")

    carol.fill("#capacity-query input[name=gpus]", "8")
    carol.click("#capacity-query button[type=submit]")
    options = carol.locator("#options-1")
    expect(options.locator("thead")).to_contain_text("+8 GPUs")
    expect(options.locator("tr.buy")).to_contain_text("Buy: owning")
    expect(options.locator("tr.rent").first).to_contain_text("Rent on demand")
    expect(carol.locator("#tco-1")).to_contain_text("Owning is cheaper above")
    expect(carol.locator("#tco-1")).to_contain_text("46% utilization")
    expect(pool.locator(".chart svg.main-svg").first).to_be_visible(timeout=SLOW)
    shoot(carol, "capacity-finance")

    with carol.expect_download() as download:
        carol.click("#export-csv")
    assert download.value.suggested_filename.endswith(".csv")
    rows = list(csv.reader(io.StringIO(Path(download.value.path()).read_text())))
    assert rows[0] == ["pool", "subtree", "figure", "value", "explain"]
    figures = {row[2]: row[3] for row in rows[1:]}
    assert figures["saturation_p50"] == "2026-12-16"
    assert "option +8 GPUs own" in figures and "option +8 GPUs on_demand" in figures


def test_a_department_admin_sees_their_subtree_only(org: Org, page_for: Any) -> None:
    stored_run(org)
    dana = page_for("dana")
    dana.click("nav >> text=Capacity")
    expect(dana.locator("#pool-1 h2")).to_contain_text("research")
    expect(dana.locator("#pool-1 .chart svg.main-svg").first).to_be_visible(timeout=SLOW)
    expect(dana.locator("#pool-1 table.drivers tbody tr")).to_have_count(2)
    assert "team-charlie" not in dana.content()
    assert dana.locator("#tco-form").count() == 0
    shoot(dana, "capacity-department-admin")
