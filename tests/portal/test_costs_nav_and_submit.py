"""Issue 35's smaller portal things: the navigation links the Costs page for whoever may see
costs, an empty Costs page says when the next metering runs, and nobody who cannot submit
sees a "Submit a job" button."""

from __future__ import annotations

import re
from datetime import UTC, datetime
from typing import Any

import pytest
from django.urls import reverse

from billing.metering.schedule import metering_beat_schedule, metering_minute, metering_times
from portal.views import costs as costs_view
from tests.conftest import Org

pytestmark = pytest.mark.django_db


def nav(html: str) -> str:
    match = re.search(r'<nav class="nav".*?</nav>', html, re.S)
    assert match is not None
    return match.group(0)


@pytest.mark.parametrize(
    ("persona", "linked"),
    [
        ("carol", True),  # finance
        ("pat", True),  # platform admin
        ("tina", True),  # admin of team-alpha
        ("dana", True),  # admin of the research department
        ("alice", False),  # member
        ("chris", False),  # member of team-charlie
    ],
)
def test_the_nav_links_costs_for_whoever_may_see_them(
    persona: str, linked: bool, org: Org, web_for: Any
) -> None:
    client = web_for(persona)
    links = nav(client.get(reverse("portal:home")).content.decode())
    assert (f'href="{reverse("portal:costs")}"' in links) is linked
    # The link and the page agree: whoever is shown it may open it, no one else.
    assert client.get(reverse("portal:costs")).status_code == (200 if linked else 403)


@pytest.mark.parametrize(
    ("delay_s", "minute"),
    [(300, 5), (330, 6), (0, 0), (59, 1), (3900, 5)],
    ids=["default-5min", "5.5min-rounds-up", "no-delay", "under-a-minute", "over-an-hour"],
)
def test_metering_runs_at_the_minute_each_hour_becomes_due(delay_s: float, minute: int) -> None:
    assert metering_minute(delay_s) == minute
    assert metering_beat_schedule(delay_s).minute == {minute}


@pytest.mark.parametrize(
    ("now", "next_run", "hour_metered_at"),
    [
        # 13:02: the 12:00 hour is metered at 13:05; the 13:00 hour at 14:05.
        ("13:02:00", "13:05", "14:05"),
        # 13:05 exactly: that run is under way; the next is 14:05, which meters 13:00.
        ("13:05:00", "14:05", "14:05"),
        ("13:58:30", "14:05", "14:05"),
        # 23:30: the next run is past midnight.
        ("23:30:00", "00:05", "00:05"),
    ],
)
def test_the_next_metering_follows_from_the_clock(
    now: str, next_run: str, hour_metered_at: str
) -> None:
    at = datetime.fromisoformat(f"2031-01-10T{now}+00:00")
    times = metering_times(at, delay_s=300)
    assert f"{times.next_run:%H:%M}" == next_run and times.next_run > at
    assert f"{times.hour_metered_at:%H:%M}" == hour_metered_at


def test_an_empty_costs_page_says_when_the_next_metering_runs(
    org: Org, web_for: Any, monkeypatch: pytest.MonkeyPatch, settings: Any
) -> None:
    settings.GANTRY_METERING_DELAY_S = 300
    monkeypatch.setattr(costs_view, "clock", lambda: datetime(2031, 1, 10, 13, 2, tzinfo=UTC))
    html = web_for("tina").get(reverse("portal:costs")).content.decode()
    assert "Costs appear after the next metering, at 13:05 UTC (hourly)." in html
    assert "the use of the hour running now appears after 14:05 UTC" in html
    assert "No costs you may see" not in html
    # A month already past has nothing left to meter: no promise of a metering there.
    past = web_for("tina").get(reverse("portal:costs"), {"month": "2030-11"}).content.decode()
    assert "next metering" not in past and "No costs you may see in these months." in past


def test_the_beat_meters_at_the_computed_minute(settings: Any) -> None:
    from billing.tasks import meter_closed_hours

    entry = settings.CELERY_BEAT_SCHEDULE["billing-meter"]
    assert entry["task"] == meter_closed_hours.name
    assert entry["schedule"].minute == {metering_minute(settings.GANTRY_METERING_DELAY_S)}


def submit_buttons(html: str) -> int:
    return html.count(f'href="{reverse("portal:job-new")}"')


@pytest.mark.parametrize("page", ["portal:home", "portal:jobs"])
def test_finance_sees_no_submit_button_anywhere(page: str, org: Org, web_for: Any) -> None:
    html = web_for("carol").get(reverse(page)).content.decode()
    assert submit_buttons(html) == 0
    assert "Submit a job" not in html
    # The button would lead to a refusal: finance may not submit.
    assert web_for("carol").get(reverse("portal:job-new")).status_code == 403


@pytest.mark.parametrize("persona", ["alice", "pat"])
def test_those_who_may_submit_keep_the_button(persona: str, org: Org, web_for: Any) -> None:
    client = web_for(persona)
    # The navigation's Submit link and the list's button.
    assert submit_buttons(client.get(reverse("portal:jobs")).content.decode()) == 2
    assert "Submit a job" in client.get(reverse("portal:home")).content.decode()
    assert client.get(reverse("portal:job-new")).status_code == 200
