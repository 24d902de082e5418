"""The tenant page's spend to date, committed and forecast to month end (issue 18), for
those who may see the tenant's costs, from the metered usage, in a bounded number of queries.

H100 costs 4.00 a GPU-hour. The month is February 2031 (the builders' at(4) is 1 February
00:00 UTC); metering has metered up to at(11), 07:00, when the page is opened.
"""

from __future__ import annotations

import re
from datetime import timedelta
from decimal import Decimal
from typing import Any

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

from billing.budgets import checks as admission
from billing.budgets import forecast
from billing.budgets.forecast import tenant_cost_scope, tenant_spend_forecast
from billing.metering.hourly import meter_usage
from billing.rates.cards import RatePrices, rate_card_add
from scheduler.jobs.services import job_submit
from tests.billing.builders import T0, at, hold, job_for, make_node
from tests.conftest import Org, job_spec

NOW = at(11) + timedelta(minutes=10)


@pytest.fixture(autouse=True)
def clock(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(forecast, "clock", lambda: NOW)
    monkeypatch.setattr(admission, "clock", lambda: NOW)


def metered_month(org: Org) -> None:
    rate_card_add(
        user=org.users["pat"],
        flavor=org.h100,
        valid_from=T0 - timedelta(days=2),
        prices=RatePrices(Decimal(4)),
    )
    node = make_node("n1", gpus=8)
    # alpha: one GPU from 31 January 00:00 to 1 February 07:00, 31 hours, 7 of them in
    # February (28.00). bravo: two GPUs for two hours in February (16.00).
    hold(job_for(org, "alice", name="alpha-long"), node, -20, 11, [1000])
    bravo = job_for(org, "bob-bravo", project=org.proj_bravo, name="bravo-short")
    hold(bravo, node, 4, 6, [1000, 1000], first_device=1)
    meter_usage(now=NOW)
    # A queued job of alpha reserves 2 x 4 GPUs x 10 h x 4.00 = 320.00.
    job_submit(
        user=org.users["alice"],
        project=org.proj_alpha,
        payload=job_spec(name="queued", max_runtime_s=10 * 3600),
    )


def figures(html: str) -> dict[str, str]:
    found = {}
    for key in ("spent", "committed", "forecast"):
        match = re.search(rf'id="spend-{key}">([^<]*)<', html)
        found[key] = match.group(1).split()[-1] if match else ""
    return found


def page(web_for: Any, username: str, tenant: Any) -> Any:
    return web_for(username).get(reverse("portal:tenant-detail", args=[tenant.pk]))


def test_the_team_page_shows_spend_committed_and_forecast_worked_out(
    org: Org, web_for: Any
) -> None:
    metered_month(org)
    html = page(web_for, "tina", org.alpha).content.decode()
    # Burn: the last 24 metered hours (at(-13) to at(11)) held one GPU: 96.00 / 24 = 4.00
    # an hour. Hours left after 1 February 07:00: 28 x 24 - 7 = 665.
    # Forecast: 28.00 + 4.00 x 665 = 2688.00.
    assert figures(html) == {"spent": "28.00", "committed": "320.00", "forecast": "2688.00"}
    method = re.sub(r"\s+", " ", re.search(r'id="spend-method">(.*?)</p>', html, re.S).group(1))
    assert "4.00 an hour (the last 24 metered hours)" in method
    assert "665 hours left after 2031-02-01 07:00 UTC" in method


def test_the_department_page_adds_up_its_teams(org: Org, web_for: Any) -> None:
    metered_month(org)
    html = page(web_for, "dana", org.research).content.decode()
    # Spent: 28.00 + 16.00. Burn: (96.00 + 16.00) / 24 an hour;
    # forecast: 44.00 + 112 / 24 x 665 = 44.00 + 3103.33 = 3147.33.
    assert figures(html) == {"spent": "44.00", "committed": "320.00", "forecast": "3147.33"}
    assert tenant_spend_forecast(org.research).burn_per_hour == Decimal("4.67")


@pytest.mark.parametrize(
    ("username", "tenant", "scope"),
    [
        ("carol", "research", "subtree"),  # finance
        ("pat", "bravo", "subtree"),  # platform admin
        ("dana", "alpha", "subtree"),  # admin of an ancestor
        ("tina", "alpha", "subtree"),  # the team's admin
        ("alice", "alpha", "projects"),  # a member: the team's projects are theirs
        ("alice", "research", None),  # a member of one team: not the department's
        ("chris", "alpha", None),
    ],
)
def test_who_sees_the_figures_follows_the_cost_rule(
    org: Org, username: str, tenant: str, scope: str | None
) -> None:
    assert tenant_cost_scope(org.users[username], getattr(org, tenant)) == scope


def test_a_member_sees_their_projects_figures_and_no_other_teams(org: Org, web_for: Any) -> None:
    metered_month(org)
    response = page(web_for, "alice", org.alpha)
    html = response.content.decode()
    assert figures(html)["spent"] == "28.00"
    assert "The jobs of your teams' projects." in html
    assert page(web_for, "alice", org.bravo).status_code == 404
    assert page(web_for, "chris", org.alpha).status_code == 404
    finance = page(web_for, "carol", org.research).content.decode()
    assert figures(finance)["spent"] == "44.00"


def test_the_page_rates_a_day_in_the_same_queries_whatever_the_usage(
    org: Org, web_for: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    metered_month(org)
    client = web_for("tina")
    url = reverse("portal:tenant-detail", args=[org.alpha.pk])
    client.get(url)  # the session and caches warm
    with CaptureQueriesContext(connection) as few:
        assert client.get(url).status_code == 200
    # Three hours later, with six more jobs metered meanwhile: the same queries.
    node = make_node("n2", gpus=6)
    for number in range(6):
        job = job_for(org, "alice", name=f"more-{number}")
        hold(job, node, 11, 14, [250], first_device=number)
    later = at(14) + timedelta(minutes=10)
    meter_usage(now=later)
    monkeypatch.setattr(forecast, "clock", lambda: later)
    with CaptureQueriesContext(connection) as many:
        html = client.get(url).content.decode()
    # The new hours are in: 6 x a quarter GPU x 3 h x 4.00 = 18.00 more.
    assert figures(html)["spent"] == "46.00"
    assert len(many.captured_queries) == len(few.captured_queries)


def test_before_an_hour_of_the_month_is_metered_there_is_no_forecast_yet(
    org: Org, web_for: Any
) -> None:
    # `make run` on 7 December, metering not run yet: the page said "Forecast to month end
    # EUR 0.00" beside jobs running and committing money, "x the 744 hours left after the
    # month's start". Now it says there is none yet, and when metering runs.
    job_submit(
        user=org.users["alice"],
        project=org.proj_alpha,
        payload=job_spec(name="queued", max_runtime_s=10 * 3600),
    )
    rate_card_add(
        user=org.users["pat"],
        flavor=org.h100,
        valid_from=T0 - timedelta(days=2),
        prices=RatePrices(Decimal(4)),
    )
    html = page(web_for, "tina", org.alpha).content.decode()
    assert 'id="spend-forecast"><span class="muted">not yet</span>' in html
    method = re.sub(r"\s+", " ", re.search(r'id="spend-method">(.*?)</p>', html, re.S).group(1))
    assert "No hour of February 2031 is metered yet" in method
    assert "next at 08:05 UTC" in method and "744" not in method
    assert tenant_spend_forecast(org.alpha).forecast is None
