"""A department admin replays a quota change on the What-if page and reads the result side by
side, with its chart drawn (issue 20); screenshots of the runs and of the result."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from django.utils import timezone
from playwright.sync_api import expect

from config.celery import app as celery_app
from tests.conftest import Org
from tests.portal.browser.conftest import shoot
from tests.whatif.builders import a_busy_past

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]
SLOW = 60_000  # plotly.js (4.8 MB) into a fresh browser context on a loaded machine


@pytest.fixture
def eager() -> Iterator[None]:
    """The replay runs in the request that queues it (after its commit), as a worker would."""
    celery_app.conf.task_always_eager = True
    yield
    celery_app.conf.task_always_eager = False


def test_an_admin_replays_a_quota_change_and_reads_it_side_by_side(
    org: Org, page_for: Any, eager: None
) -> None:
    a_busy_past(org, timezone.now())
    dana = page_for("dana")
    dana.click("nav >> text=What-if")
    dana.select_option("#whatif-scope", label="research")
    dana.fill("#whatif-window", "1")
    dana.select_option("#whatif-tenant", "team-bravo")
    dana.select_option("#whatif-flavor", "H100-80GB")
    dana.fill("#whatif-guaranteed", "0")
    dana.fill("#whatif-limit", "0")
    dana.click("#whatif-new button[type=submit]")
    expect(dana.locator("#whatif-run .badge")).to_have_text("Done")
    table = dana.locator("#whatif-tenant-table tbody")
    expect(table.locator("tr")).to_have_count(3)
    expect(table.locator("tr").nth(1)).to_contain_text("team-bravo")
    expect(table.locator("tr").nth(1)).to_contain_text("1 of 1")  # today
    expect(table.locator("tr").nth(1)).to_contain_text("0 of 1")  # proposed: never starts
    expect(table.locator("tr").nth(2)).to_contain_text("others")
    expect(dana.locator("#chart-whatif-waits svg.main-svg").first).to_be_visible(timeout=SLOW)
    expect(dana.locator("#chart-whatif-waits .barlayer .trace")).to_have_count(4)
    assert "charlie" not in dana.content()
    shoot(dana, "whatif-result")
    dana.click("text=All runs")
    expect(dana.locator("#whatif-list tbody tr")).to_have_count(1)
    expect(dana.locator("#whatif-list")).to_contain_text("team-bravo, H100-80GB")
    shoot(dana, "whatif-runs")
