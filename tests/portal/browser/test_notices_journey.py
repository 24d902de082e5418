"""Issue 35's smaller things that a person sees in the portal, in Chromium: the approvers'
inbox after the demo load ran (it piled up every chat-canary job), and a 1-minute idle rule
("1 minutes"). On the embedded default in `make test`'s SQLite pass, on PostgreSQL in the
other."""

from __future__ import annotations

from typing import Any

from playwright.sync_api import expect

from scheduler.demo.seed import DEMO_PASSWORD, seed_demo
from tenants.models import ApprovalRequest, ApprovalState, IdleRule, Tenant
from tests.conftest import Org
from tests.daemon.test_demo_load import demo_load_run
from tests.portal.browser.conftest import PASSWORD

LOAD_TICKS = 70  # ten rounds of the demo's seven templates


def login(browser: Any, live_server: Any, username: str, password: str) -> Any:
    context = browser.new_context(base_url=live_server.url)
    context.set_default_timeout(20_000)
    page = context.new_page()
    page.goto("/accounts/login/")
    page.fill("input[name=username]", username)
    page.fill("input[name=password]", password)
    page.click("button[type=submit]")
    page.wait_for_url(f"{live_server.url}/", timeout=60_000)
    return page


def test_the_demo_load_leaves_the_approvers_inbox_as_seeded(browser: Any, live_server: Any) -> None:
    seed_demo()
    pending = ApprovalRequest.objects.filter(state=ApprovalState.PENDING)
    product = Tenant.objects.get(slug="product")
    seeded = pending.filter(tenant__path__startswith=product.path).count()
    assert seeded == 1  # chat-7b-serving, an inference job without a maximum runtime
    load = demo_load_run(LOAD_TICKS)
    assert load.count >= LOAD_TICKS * 0.9
    # paul, product's admin, decides its requests: the load added none to his inbox.
    paul = login(browser, live_server, "paul", DEMO_PASSWORD)
    paul.click("nav >> text=Approvals")
    rows = paul.locator("tr[id^=approval-]")
    expect(rows).to_have_count(seeded)
    expect(rows.first).to_contain_text("chat-7b-serving")
    expect(paul.locator("body")).not_to_contain_text("chat-canary")


def test_a_one_minute_idle_rule_reads_1_minute(org: Org, browser: Any, live_server: Any) -> None:
    IdleRule.objects.create(tenant=org.alpha, threshold_pct=5, duration_s=60)
    alice = login(browser, live_server, "alice", PASSWORD)
    alice.goto(f"/tenants/{org.alpha.pk}/notifications/")
    expect(alice.locator("body")).to_contain_text("1 minute of it")
    expect(alice.locator("body")).not_to_contain_text("1 minutes")
