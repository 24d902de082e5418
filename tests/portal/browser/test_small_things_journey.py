"""Browser journeys of issue 35's smaller portal things, in headless Chromium against the
live server: the Costs link and the next metering, no Submit for finance, a GPU-share job
quoted and submitted without "GPUs per replica" (the form still itself after the Quote), a
dashboard of one utilization window drawn, and a simulated node failure and recovery."""

from __future__ import annotations

import re
from typing import Any

import pytest
from playwright.sync_api import expect

from scheduler.models import Job, Node
from tests.conftest import Org
from tests.portal.browser.test_dashboards_journey import SLOW, drawn
from tests.portal.test_nodes_page import make_node
from tests.portal.test_single_window_charts import one_window

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def test_a_team_admin_finds_costs_in_the_nav_and_when_they_appear(org: Org, page_for: Any) -> None:
    tina = page_for("tina")
    tina.click("nav >> text=Costs")
    expect(tina).to_have_url(re.compile(r"/costs/$"))
    expect(tina.locator("nav a[aria-current=page]")).to_have_text("Costs")
    expect(tina.locator("#costs-next-metering")).to_have_text(
        re.compile(r"^Costs appear after the next metering, at \d\d:05 UTC \(hourly\)\.$")
    )
    expect(tina.locator("body")).not_to_contain_text("No costs you may see")
    alice = page_for("alice")
    expect(alice.locator("nav")).not_to_contain_text("Costs")


def test_finance_sees_costs_but_no_submit_button(org: Org, page_for: Any) -> None:
    carol = page_for("carol")
    expect(carol.locator("nav >> text=Costs")).to_be_visible()
    expect(carol.locator("nav")).not_to_contain_text("Submit")
    expect(carol.get_by_text("Submit a job")).to_have_count(0)
    carol.click("nav >> text=Jobs")
    expect(carol.locator("h1")).to_have_text("Jobs")
    expect(carol.get_by_text("Submit a job")).to_have_count(0)


def test_a_gpu_share_is_quoted_and_submitted_without_gpus_per_replica(
    org: Org, page_for: Any
) -> None:
    alice = page_for("alice")
    alice.click("nav >> text=Submit")
    alice.fill("input[name=name]", "notebook-share")
    alice.fill("input[name=command]", "jupyter lab")
    alice.fill("input[name=gpus]", "")
    alice.fill("input[name=gpu_milli]", "500")
    alice.fill("input[name=gpu_memory_mib]", "20000")
    alice.fill("input[name=max_runtime_hours]", "2")
    alice.click("#quote-button")
    # 1. the quote, and no error on the blank GPUs field
    expect(alice.locator("#quote")).to_contain_text("Nothing was submitted")
    expect(alice.locator("#form-errors")).to_have_count(0)
    # 2. every field as typed, and the form's own behaviour still there after the swap
    for name, value in [("name", "notebook-share"), ("command", "jupyter lab"), ("gpus", ""),
                        ("gpu_milli", "500"), ("gpu_memory_mib", "20000"),
                        ("max_runtime_hours", "2")]:  # fmt: skip
        expect(alice.locator(f"input[name={name}]")).to_have_value(value)
    expect(alice.locator("#field-min_replicas")).to_be_hidden()
    alice.select_option("select[name=job_type]", "inference")
    expect(alice.locator("#field-min_replicas")).to_be_visible()
    expect(alice.locator("input[name=replicas]")).to_have_value("2")
    alice.select_option("select[name=job_type]", "training")
    expect(alice.locator("#field-min_replicas")).to_be_hidden()
    # 3. the type's defaults filled GPUs in again: blank them and submit the share
    alice.fill("input[name=gpus]", "")
    alice.fill("input[name=max_runtime_hours]", "2")
    alice.click("button:has-text('Submit job')")
    expect(alice.locator(".flash-success")).to_contain_text("Job notebook-share submitted")
    job = Job.objects.get(name="notebook-share")
    assert (job.gpus_per_replica, job.gpu_milli_per_replica) == (0, 500)


def test_a_single_utilization_window_draws(org: Org, page_for: Any) -> None:
    job = one_window(org)
    pat = page_for("pat")
    pat.click("nav >> text=Cluster")
    drawn(pat, "capacity")
    # The one window's points are markers: a line of one point draws nothing.
    expect(pat.locator("#chart-capacity .scatterlayer .trace .points path").first).to_be_visible(
        timeout=SLOW
    )
    alice = page_for("alice")
    alice.goto(f"/jobs/{job.pk}/")
    drawn(alice, "job-utilization")
    expect(
        alice.locator("#chart-job-utilization .scatterlayer .trace .points path").first
    ).to_be_visible(timeout=SLOW)


def test_a_platform_admin_simulates_a_node_failure_and_recovers_it(org: Org, page_for: Any) -> None:
    node = make_node("sim-a100-01")
    pat = page_for("pat")
    pat.click("nav >> text=Nodes")
    pat.click("#node-table a:has-text('sim-a100-01')")
    expect(pat.locator("#node-simulation")).to_contain_text("Simulated cluster")
    # 1. the confirmation dismissed: nothing happens
    pat.once("dialog", lambda dialog: dialog.dismiss())
    pat.click("#node-actions button[value=fail]")
    expect(pat.locator("#node-actions button[value=fail]")).to_be_visible()
    assert not Node.objects.get(pk=node.pk).sim_failed
    # 2. accepted: the node fails, as through the API's fail route
    messages: list[str] = []

    def accept(dialog: Any) -> None:
        messages.append(dialog.message)
        dialog.accept()

    pat.once("dialog", accept)
    pat.click("#node-actions button[value=fail]")
    expect(pat.locator(".flash-success")).to_contain_text("Node sim-a100-01 failed (simulated)")
    expect(pat.locator("#node-health")).to_have_text("not ready")
    assert "Simulate a failure of sim-a100-01?" in messages[0]
    assert Node.objects.get(pk=node.pk).sim_failed
    # 3. recovered
    pat.click("#node-actions button[value=recover]")
    expect(pat.locator(".flash-success")).to_contain_text("Node sim-a100-01 recovered")
    expect(pat.locator("#node-actions button[value=fail]")).to_be_visible()
    assert not Node.objects.get(pk=node.pk).sim_failed
