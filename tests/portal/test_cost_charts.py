"""The cost charts (costs page, finance home): every figure and every table cell is the cost
API's for the same window and viewer; plotly.js is served from the installed package.

The cluster is tests/billing/test_statements.py's (January's last four hours), plus a job of
team-alpha that holds a device in February's first two hours, so the charts span two months
with costs in them.
"""

from __future__ import annotations

import html as html_lib
import json
import re
from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from django.contrib.staticfiles import finders
from django.core.management import call_command
from django.templatetags.static import static
from django.test import Client
from django.urls import reverse

from billing.budgets.spend import budget_position
from billing.metering.hourly import meter_hour, meter_usage
from billing.models import Budget, BudgetUnit
from portal.charts import NO_DEPARTMENT, NO_FLAVOR
from tenants.models import Tenant
from tests.billing.builders import at, hold, job_for, make_node
from tests.billing.test_statements import cluster
from tests.conftest import Org

MONTHS = ["2030-09", "2030-10", "2030-11", "2030-12", "2031-01", "2031-02"]
PLOTLY = "vendor/plotly/plotly.min.js"


def two_months(org: Org) -> None:
    cluster(org)
    february = job_for(org)  # team-alpha, alice
    hold(february, make_node("n3", gpus=1), 4, 6, [1000])  # 2031-02-01 00:00 to 02:00
    meter_usage(now=at(8))


def page(org: Org, username: str, **query: Any) -> str:
    client = Client()
    client.force_login(org.users[username])
    response = client.get(reverse("portal:costs"), {"month": "2031-02", **query})
    assert response.status_code == 200
    return response.content.decode()


def figure(html: str, name: str) -> dict[str, Any]:
    found = re.search(rf'<script id="figure-{name}" type="application/json">(.*?)</script>', html)
    assert found is not None, f"no figure {name}"
    return json.loads(found.group(1))


def table(html: str, name: str) -> dict[str, list[str]]:
    """The rows of the chart's table: row header -> its cells."""
    found = re.search(rf'<table id="table-{name}">(.*?)</table>', html, re.S)
    assert found is not None, f"no table {name}"
    assert "<caption" in found.group(1) and 'scope="col"' in found.group(1)
    rows = re.findall(r'<tr><th scope="row">([^<]*)</th>(.*?)</tr>', found.group(1), re.S)
    return {
        html_lib.unescape(name): re.findall(r'<td class="num">([^<]*)</td>', cells)
        for name, cells in rows
    }


def api(client: Any, month: str, by: str, **filters: Any) -> dict[str, Any]:
    year, number = (int(part) for part in month.split("-"))
    end = f"{year + number // 12}-{number % 12 + 1:02d}-01"
    response = client.get(
        "/api/v1/costs/", {"from": f"{month}-01", "to": end, "by": by, "page_size": 200, **filters}
    )
    assert response.status_code == 200, response.content
    return response.json()


def traces(fig: dict[str, Any]) -> dict[str, dict[str, float]]:
    """trace name -> {x: y}."""
    return {t["name"]: dict(zip(t["x"], t["y"], strict=True)) for t in fig["data"]}


PERSONAS = ["carol", "dana", "tina"]  # finance; admin of research; admin of team-alpha


def tenants(org: Org) -> list[Any]:
    return [org.acme, org.research, org.product, org.alpha, org.bravo, org.charlie]


@pytest.mark.parametrize("username", PERSONAS)
def test_department_chart_and_table_equal_the_cost_api_per_month(
    org: Org, client_for: Any, username: str
) -> None:
    two_months(org)
    html = page(org, username)
    client = client_for(username)
    expected: dict[str, dict[str, str]] = {}
    for month in MONTHS:
        for row in api(client, month, "department")["results"]:
            expected.setdefault(row["name"] or NO_DEPARTMENT, {})[month] = row["charged"]
    assert expected["research"]["2031-01"] != "0.00" and expected["research"]["2031-02"] != "0.00"
    drawn = traces(figure(html, "departments"))
    shown = table(html, "departments")
    assert set(drawn) == set(expected) and set(shown) == set(expected) | {"Total"}
    for name, months in expected.items():
        amounts = [months.get(month, "0.00") for month in MONTHS]
        assert [drawn[name][month] for month in MONTHS] == [float(a) for a in amounts], name
        assert shown[name] == amounts, name
    totals = [api(client, month, "department")["total"]["charged"] for month in MONTHS]
    assert shown["Total"] == totals


@pytest.mark.parametrize("username", PERSONAS)
def test_flavor_chart_and_table_equal_the_cost_api(
    org: Org, client_for: Any, username: str
) -> None:
    two_months(org)
    html = page(org, username)
    rows = api(client_for(username), "2031-02", "flavor")["results"]
    expected = {row["name"] or NO_FLAVOR: row for row in rows}
    assert expected["H100-80GB"]["charged"] != "0.00"
    drawn = traces(figure(html, "flavors"))
    shown = table(html, "flavors")
    assert set(shown) == set(expected) == set(drawn["charged"])
    for name, row in expected.items():
        assert shown[name] == [row["charged"], row["showback"], row["gpu_hours"]], name
        assert drawn["charged"][name] == float(row["charged"])
        assert drawn["showback"][name] == float(row["showback"])


@pytest.mark.parametrize("username", PERSONAS)
def test_idle_chart_and_table_equal_the_cost_api(org: Org, client_for: Any, username: str) -> None:
    """The API adds up a tenant's subtree; a tenant's own idle lines are its subtree's less
    its children's."""
    two_months(org)
    html = page(org, username)
    client = client_for(username)
    subtree = {
        tenant: api(client, "2031-02", "team", tenant=tenant.pk, kind="idle-reserved")["total"]
        for tenant in tenants(org)
    }
    expected = {}
    for tenant in tenants(org):
        children = [t for t in tenants(org) if t.parent_id == tenant.pk]
        own = [
            Decimal(subtree[tenant][part]) - sum(Decimal(subtree[c][part]) for c in children)
            for part in ("charged", "showback")
        ]
        if any(own):
            expected[tenant.slug] = [str(amount) for amount in own]
    assert expected, "the cluster has idle reserved capacity in February"
    shown = {name: cells[:2] for name, cells in table(html, "idle").items()}
    assert shown == expected
    drawn = traces(figure(html, "idle"))
    assert {name: [drawn["charged"][name], drawn["showback"][name]] for name in shown} == {
        name: [float(a) for a in amounts] for name, amounts in expected.items()
    }


def test_a_team_admin_sees_only_their_subtree_in_the_charts(org: Org) -> None:
    two_months(org)
    html = page(org, "tina")
    for other in ("product", "team-charlie", "team-bravo", "acme"):
        assert other not in html, other
    finance = page(org, "carol")
    assert "product" in finance and "team-bravo" in finance


def test_the_finance_home_page_leads_with_the_charts_of_this_month(
    org: Org, client_for: Any, monkeypatch: Any
) -> None:
    from django.utils import timezone

    two_months(org)
    monkeypatch.setattr(timezone, "now", lambda: at(8))  # 2031-02-01T04:00Z
    client = Client()
    client.force_login(org.users["carol"])
    html = client.get(reverse("portal:home")).content.decode()
    assert html.index('id="costs-charts"') < html.index('id="home-finance"')
    assert traces(figure(html, "departments"))["research"]["2031-02"] == float(
        next(
            row["charged"]
            for row in api(client_for("carol"), "2031-02", "department")["results"]
            if row["name"] == "research"
        )
    )
    assert reverse("portal:costs") in html.split('id="costs-charts"')[1]
    assert static(PLOTLY) in html


@pytest.mark.parametrize("username", ["alice", "tina"])
def test_the_home_page_of_others_has_no_charts(org: Org, username: str) -> None:
    two_months(org)
    client = Client()
    client.force_login(org.users[username])
    html = client.get(reverse("portal:home")).content.decode()
    assert 'id="costs-charts"' not in html and PLOTLY not in html


def test_plotly_js_is_served_from_the_installed_package(org: Org) -> None:
    job = job_for(org)
    client = Client()
    client.force_login(org.users["carol"])
    for url in [
        reverse("portal:costs") + "?month=2031-02",
        reverse("portal:home"),
        reverse("portal:job-detail", args=[job.pk]),
    ]:
        html = client.get(url).content.decode()
        scripts = re.findall(r"<script[^>]* src=\"([^\"]+)\"", html)
        assert all(src.startswith("/static/") for src in scripts), (url, scripts)  # no CDN
        assert "cdn" not in html.lower(), url
        assert "<script>" not in html, url  # no inline script: a CSP of script-src 'self' holds
        if "/jobs/" not in url:
            assert static(PLOTLY) in scripts, url
    response = Client().get(static(PLOTLY))
    assert response.status_code == 200
    assert response["Content-Type"].startswith(("text/javascript", "application/javascript"))
    body = b"".join(response.streaming_content)  # type: ignore[attr-defined]
    import plotly

    packaged = Path(plotly.__file__).parent / "package_data" / "plotly.min.js"
    assert body == packaged.read_bytes()
    assert finders.find(PLOTLY) == str(packaged)


def test_collectstatic_copies_plotly_js_for_production(tmp_path: Path, settings: Any) -> None:
    settings.STATIC_ROOT = tmp_path
    call_command("collectstatic", "--noinput", verbosity=0)
    assert (tmp_path / PLOTLY).stat().st_size > 1_000_000


@pytest.mark.parametrize(("username", "limit"), [("carol", 113), ("tina", 110)])
def test_the_costs_page_rates_each_month_once(
    org: Org, django_assert_max_num_queries: Any, username: str, limit: int
) -> None:
    """The page's queries grow with its six months and the organisations, never with lines
    or jobs. Rating the month shown a second time (for the table) would cost a month's
    queries again."""
    two_months(org)
    client = Client()
    client.force_login(org.users[username])
    client.get(reverse("portal:costs"), {"month": "2031-02"})
    with django_assert_max_num_queries(limit):
        assert client.get(reverse("portal:costs"), {"month": "2031-02"}).status_code == 200


# --- budget burn-down ----------------------------------------------------------------------

FEBRUARY = datetime(2031, 2, 1, tzinfo=UTC)


def with_budgets(org: Org) -> None:
    """February: team-alpha's job holds one device on the 1st, 00:00-02:00 (two_months), and
    another on the 2nd, 00:00-02:00: 2 GPU-hours x 3.00 = 6.00 each day. Budgets: research
    20.00, team-alpha 3 GPU-hours, product 5.00 (nothing spent)."""
    two_months(org)
    second = job_for(org)
    hold(second, make_node("n4", gpus=1), 28, 30, [1000])
    meter_hour(at(28), now=at(31))
    meter_hour(at(29), now=at(31))
    for tenant, unit, limit in [
        (org.research, BudgetUnit.MONEY, "20.00"),
        (org.alpha, BudgetUnit.GPU_HOURS, "3.00"),
        (org.product, BudgetUnit.MONEY, "5.00"),
    ]:
        Budget.objects.create(tenant=tenant, month=FEBRUARY, unit=unit, limit=Decimal(limit))


def burn_down_table(html: str, slug: str) -> list[tuple[str, str]]:
    found = re.search(rf'<table id="table-budget-{slug}">(.*?)</table>', html, re.S)
    assert found is not None, slug
    return re.findall(
        r'<tr><th scope="row">([^<]*)</th><td class="num">([^<]*)</td>', found.group(1)
    )


@pytest.mark.parametrize(
    ("username", "budgets"),
    [
        ("carol", {"research", "team-alpha", "product"}),
        ("dana", {"research", "team-alpha"}),
        ("tina", {"team-alpha"}),
    ],
)
def test_burn_down_day_by_day_ends_at_the_budget_position(
    org: Org, username: str, budgets: set[str]
) -> None:
    with_budgets(org)
    html = page(org, username)
    shown = set(re.findall(r'<table id="table-budget-([a-z-]+)">', html))
    assert shown == budgets
    expected = {
        "research": ["6.00", "12.00"],  # money
        "team-alpha": ["2.00", "4.00"],  # GPU-hours
        "product": ["0.00", "0.00"],
    }
    for slug in budgets:
        rows = burn_down_table(html, slug)
        assert len(rows) == 28 and rows[0][0] == "2031-02-01"
        assert [spent for _, spent in rows] == expected[slug] + [""] * 26  # 3rd on: not metered
        tenant = Tenant.objects.get(slug=slug)
        position = budget_position(tenant, FEBRUARY)
        assert position is not None and rows[1][1] == str(position.spent)
        budget = Budget.objects.get(tenant=tenant)
        drawn = traces(figure(html, f"budget-{budget.pk}"))
        assert list(drawn["spent"].values()) == [float(a) for a in expected[slug]] + [None] * 26
        assert set(drawn["limit"].values()) == {float(budget.limit)}


def test_the_finance_home_page_rates_each_month_once(
    org: Org, django_assert_max_num_queries: Any, monkeypatch: Any
) -> None:
    from django.utils import timezone

    two_months(org)
    monkeypatch.setattr(timezone, "now", lambda: at(8))
    client = Client()
    client.force_login(org.users["carol"])
    client.get(reverse("portal:home"))
    with django_assert_max_num_queries(103):
        assert client.get(reverse("portal:home")).status_code == 200


def test_an_earlier_month_without_a_rate_leaves_the_month_shown_alone(org: Org) -> None:
    """December 2030 has a metered hour of a flavor without a rate then (the first rate card
    starts on 2031-01-01): the February page shows its charts and says December is not
    priced; December's own page is the error it was."""
    two_months(org)
    old = job_for(org)
    hold(old, make_node("n5", gpus=1), -24 * 40, -24 * 40 + 1, [1000])  # 2030-12-22
    meter_hour(at(-24 * 40), now=at(8))
    html = page(org, "carol")
    assert "Not priced: 2030-12" in html
    shown = table(html, "departments")
    assert shown["research"][MONTHS.index("2030-12")] == "no rate"
    assert shown["research"][MONTHS.index("2031-02")] != "0.00"
    assert traces(figure(html, "departments"))["research"]["2030-12"] is None
    client = Client()
    client.force_login(org.users["carol"])
    december = client.get(reverse("portal:costs"), {"month": "2030-12"})
    assert december.status_code == 400 and "no rate card" in december.content.decode()
