"""The cost API: the same figures as the statements, per dimension, for whoever may see them.

The cluster is tests/billing/test_statements.py's (hours 0-4 from T0, a rate change at hour 2).
"""

from __future__ import annotations

from decimal import Decimal
from typing import Any

import pytest

from billing.statements.closing import statement_adjust, statement_close
from billing.statements.rollup import roll_up
from tests.billing.builders import T0, at
from tests.billing.test_statements import cluster
from tests.conftest import Org

WINDOW = {"from": "2031-01-31T20:00:00Z", "to": "2031-02-01T00:00:00Z"}  # [T0, at(4))


def costs(client: Any, **params: Any) -> Any:
    response = client.get("/api/v1/costs/", {**WINDOW, **params})
    assert response.status_code == 200, response.json()
    return response.json()


def by_name(body: Any) -> dict[Any, str]:
    return {row["name"]: row["charged"] for row in body["results"]}


@pytest.mark.parametrize(
    "by", ["department", "team", "project", "user", "flavor", "job_type", "priority_class"]
)
def test_every_aggregation_adds_up_to_the_statement(org: Org, client_for: Any, by: str) -> None:
    cluster(org)
    pat = org.users["pat"]
    statement = statement_close(user=pat, organisation=org.acme, start=T0, end=at(4), now=at(5))
    statement_adjust(
        user=pat, statement=statement, tenant=org.charlie, amount=Decimal("-2.00"), reason="node"
    )
    totals = roll_up(statement.lines.values_list("tenant_id", "amount", "charged"))
    body = costs(client_for("carol"), by=by)
    assert body["currency"] == "USD" or len(body["currency"]) == 3
    charged = sum((Decimal(r["charged"]) for r in body["results"]), Decimal(0))
    assert charged == totals[org.acme.pk].charged == Decimal(body["total"]["charged"])
    if by in ("department", "team"):
        tenants = (
            [org.research, org.product]
            if by == "department"
            else [org.alpha, org.bravo, org.charlie]
        )
        got = by_name(body)
        for tenant in tenants:
            assert Decimal(got[tenant.slug]) == totals[tenant.pk].charged, tenant.slug


def test_team_figures_worked_out(org: Org, client_for: Any) -> None:
    cluster(org)
    got = by_name(costs(client_for("carol"), by="team", **{"to": "2031-01-31T21:00:00Z"}))
    # Hour 0 (test_statements.test_hour_zero_worked_out): alpha used 2.50 + idle 1.50,
    # bravo preempted 0.50 + idle 1.50, charlie idle 2.00.
    assert got == {"team-alpha": "4.00", "team-bravo": "2.00", "team-charlie": "2.00"}


def test_kind_and_flavor_filters(org: Org, client_for: Any) -> None:
    cluster(org)
    client = client_for("pat")
    body = costs(client, by="team", kind="failed")
    assert by_name(body) == {"team-charlie": "2.00"}  # chris's failed hour at 2.00
    assert costs(client, by="team", flavor="A100-40GB")["results"] == []
    assert costs(client, tenant=987654)["results"] == []  # no such tenant: an empty page
    body = costs(client, by="team", tenant=org.research.pk, kind="preempted")
    assert by_name(body) == {"team-bravo": "1.00"}  # 500 milli from 0.5 to 1.5 h at 2.00


def test_a_member_sees_their_projects_and_a_team_admin_their_subtree(
    org: Org, client_for: Any
) -> None:
    cluster(org)
    # alice (member of team-alpha): proj-alpha's lines, not the team's idle reserved line.
    member = costs(client_for("alice"), by="project")
    assert [r["name"] for r in member["results"]] == ["proj-alpha"]
    assert "bravo" not in str(member) and "charlie" not in str(member)
    # tina (admin of team-alpha): the team's lines, its idle reserved capacity included.
    admin = costs(client_for("tina"), by="team")
    assert [r["name"] for r in admin["results"]] == ["team-alpha"]
    assert Decimal(admin["total"]["charged"]) > Decimal(member["total"]["charged"])
    # dana (admin of research): alpha and bravo, never charlie.
    assert set(by_name(costs(client_for("dana"), by="team"))) == {"team-alpha", "team-bravo"}
    # chris asks for research's subtree: nothing of it is his; an empty page, not its figures.
    assert costs(client_for("chris"), tenant=org.research.pk)["results"] == []


@pytest.mark.parametrize(
    ("params", "field"),
    [
        ({"from": "2031-02-01", "to": "2031-01-01"}, "to"),
        ({"from": "2031-01-01", "to": "2032-03-01"}, "to"),
        ({"from": "yesterday"}, "from"),
        ({"to": "2031-01-01T10:30:00Z"}, "to"),
        ({"by": "planet"}, "by"),
        ({"kind": "free"}, "kind"),
        ({"tenant": "abc"}, "tenant"),
        ({"project": "0"}, "project"),
        ({"page_size": "1000"}, "page_size"),
    ],
    ids=[
        "reversed",
        "longer-than-400-days",
        "not-a-date",
        "not-on-the-hour",
        "unknown-dimension",
        "unknown-kind",
        "tenant-not-an-id",
        "project-zero",
        "page-too-large",
    ],
)
def test_bad_query_is_a_400_naming_the_field(
    org: Org, client_for: Any, params: dict[str, str], field: str
) -> None:
    response = client_for("carol").get("/api/v1/costs/", params)
    assert response.status_code == 400, response.content
    assert field in response.json()["errors"], response.json()


def test_pages_like_the_other_lists(org: Org, client_for: Any) -> None:
    cluster(org)
    body = costs(client_for("carol"), by="team", page_size=2)
    assert (body["count"], len(body["results"])) == (3, 2)
    assert body["next"] is not None
    assert body["window"] == {"from": "2031-01-31T20:00:00Z", "to": "2031-02-01T00:00:00Z"}


def test_dates_and_naive_instants_are_utc_hours(org: Org, client_for: Any) -> None:
    cluster(org)
    client = client_for("carol")
    body = client.get("/api/v1/costs/", {"from": "2031-01-31", "to": "2031-02-01T00:00:00"}).json()
    assert body["window"] == {"from": "2031-01-31T00:00:00Z", "to": "2031-02-01T00:00:00Z"}
    assert body["total"] == costs(client)["total"]


@pytest.mark.parametrize("by", ["team", "job_type", "priority_class", "flavor"])
def test_a_closed_month_keeps_its_frozen_figures_after_a_policy_change(
    org: Org, client_for: Any, by: str
) -> None:
    """The cost API re-rated closed periods: a change after the close that rating reads (here
    the idle policy, charge -> showback) moved the API's figures off the frozen statement."""
    from billing.policies import billing_policy_set
    from tenants.models import Quota

    cluster(org)
    pat = org.users["pat"]
    statement = statement_close(user=pat, organisation=org.acme, start=T0, end=at(4), now=at(5))
    statement_adjust(
        user=pat, statement=statement, tenant=org.alpha, amount=Decimal("-1.25"), reason="credit"
    )
    billing_policy_set(user=pat, organisation=org.acme, idle_policy="showback")
    Quota.objects.filter(tenant=org.alpha).update(guaranteed_milli=0)
    frozen = roll_up(statement.lines.values_list("tenant_id", "amount", "charged"))
    assert frozen[org.acme.pk].charged  # idle reserved capacity is charged in the statement
    body = costs(client_for("carol"), by=by)
    assert Decimal(body["total"]["charged"]) == frozen[org.acme.pk].charged
    assert Decimal(body["total"]["showback"]) == frozen[org.acme.pk].showback
    charged = sum((Decimal(r["charged"]) for r in body["results"]), Decimal(0))
    assert charged == frozen[org.acme.pk].charged
    if by == "team":
        got = by_name(body)
        for tenant in (org.alpha, org.bravo, org.charlie):
            assert Decimal(got[tenant.slug]) == frozen[tenant.pk].charged, tenant.slug


def test_hours_outside_a_closed_period_are_rated(org: Org, client_for: Any) -> None:
    """A window over a closed period and open hours: the frozen lines plus the rated ones."""
    cluster(org)
    pat = org.users["pat"]
    statement_close(user=pat, organisation=org.acme, start=T0, end=at(2), now=at(5))
    whole = costs(client_for("carol"), by="team")
    rest = costs(client_for("carol"), by="team", **{"from": "2031-01-31T22:00:00Z"})
    first = costs(client_for("carol"), by="team", **{"to": "2031-01-31T22:00:00Z"})
    assert Decimal(whole["total"]["charged"]) == Decimal(rest["total"]["charged"]) + Decimal(
        first["total"]["charged"]
    )
