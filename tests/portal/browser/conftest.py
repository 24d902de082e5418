"""Playwright against Debian's Chromium and pytest-django's live server.

Playwright's sync API runs an event loop in this thread, and Django refuses ORM calls from a
thread with a running loop unless told it is safe; the tests only touch the ORM between
browser calls, never concurrently, so it is.
"""

from __future__ import annotations

import importlib
import os
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from django.apps import apps as django_apps

os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = "true"

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--no-first-run",
    "--disable-sync",
]
# The committed screenshots are refreshed with
#   GANTRY_SCREENSHOTS_DIR=docs/screenshots pytest tests/portal/browser
# and otherwise land in a temporary folder, so a test run leaves the working tree clean.
SCREENSHOTS = Path(
    os.environ.get("GANTRY_SCREENSHOTS_DIR") or Path(tempfile.gettempdir()) / "gantry-screenshots"
)
PASSWORD = "correct-horse-battery"  # tests.factories.UserFactory's password
LAPTOP = {"width": 1280, "height": 860}
PHONE = {"width": 390, "height": 844}


@pytest.fixture(scope="session")
def browser() -> Iterator[Any]:
    if not Path(CHROMIUM).exists():
        pytest.skip(f"{CHROMIUM} is missing: apt-get install -y chromium")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        chromium = playwright.chromium.launch(
            executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS
        )
        yield chromium
        chromium.close()


@pytest.fixture(autouse=True)
def _seeded_priority_classes(transactional_db: Any) -> None:
    """Live-server tests run in transactional mode, whose teardown truncates every table,
    the migration-seeded priority classes included; put them back for each test."""
    seed = importlib.import_module("tenants.migrations.0002_seed_priority_classes").seed
    seed(django_apps, None)


@pytest.fixture
def page_for(browser: Any, live_server: Any) -> Iterator[Callable[..., Any]]:
    """page_for("alice") -> a Playwright page logged in through the real login form."""
    contexts: list[Any] = []

    def make(username: str, viewport: dict[str, int] | None = None) -> Any:
        context = browser.new_context(viewport=viewport or LAPTOP, base_url=live_server.url)
        context.set_default_timeout(10_000)
        contexts.append(context)
        page = context.new_page()
        page.goto("/accounts/login/")
        page.fill("input[name=username]", username)
        page.fill("input[name=password]", PASSWORD)
        page.click("button[type=submit]")
        # Finance's home draws the cost charts with plotly.js (4.8 MB): slower on a busy machine.
        page.wait_for_url(f"{live_server.url}/", timeout=60_000)
        return page

    yield make
    for context in contexts:
        context.close()


def shoot(page: Any, name: str) -> None:
    """Save a full-page PNG of the page as it is now into SCREENSHOTS."""
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(SCREENSHOTS / f"{name}.png"), full_page=True)
