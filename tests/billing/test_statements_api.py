"""Statements through the API: read by whoever holds a role in the organisation (their part),
closed and adjusted by finance and platform admins (audited); the idle capacity policy."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

import pytest
from django.utils import timezone

from billing.models import BillingPolicy, Statement, StatementLine
from billing.statements.closing import statement_close
from billing.statements.rollup import roll_up
from tenants.models import AuditEntry
from tests.billing.builders import T0, at
from tests.billing.test_statements import cluster
from tests.conftest import Org


def closed(org: Org) -> Statement:
    cluster(org)
    return statement_close(
        user=org.users["pat"], organisation=org.acme, start=T0, end=at(4), now=at(5)
    )


def test_the_roll_up_is_the_statement_s_and_leaves_add_up(org: Org, client_for: Any) -> None:
    statement = closed(org)
    body = client_for("carol").get(f"/api/v1/statements/{statement.pk}/").json()
    got = {row["tenant_slug"]: Decimal(row["charged"]) for row in body["roll_up"]}
    totals = roll_up(statement.lines.values_list("tenant_id", "amount", "charged"))
    assert got["acme"] == totals[org.acme.pk].charged
    assert got["acme"] == got["research"] + got["product"]  # no lines of their own here
    lines = client_for("carol").get(f"/api/v1/statements/{statement.pk}/lines/").json()
    assert lines["count"] == statement.lines.count()


def test_a_team_admin_sees_their_subtree_and_a_member_no_partial_totals(
    org: Org, client_for: Any
) -> None:
    statement = closed(org)
    tina = client_for("tina").get(f"/api/v1/statements/{statement.pk}/").json()
    assert [row["tenant_slug"] for row in tina["roll_up"]] == ["team-alpha"]
    alice = client_for("alice").get(f"/api/v1/statements/{statement.pk}/").json()
    assert alice["roll_up"] == []
    lines = client_for("alice").get(f"/api/v1/statements/{statement.pk}/lines/").json()
    assert {line["tenant_slug"] for line in lines["results"]} == {"team-alpha"}
    assert all(line["project_slug"] == "proj-alpha" for line in lines["results"])


@pytest.mark.parametrize("persona", ["carol", "pat"])
def test_books_keepers_adjust_with_a_reason_audited(
    org: Org, client_for: Any, persona: str
) -> None:
    statement = closed(org)
    url = f"/api/v1/statements/{statement.pk}/adjust/"
    client = client_for(persona)
    missing = client.post(url, {"tenant": org.charlie.pk, "amount": "-2.00"}, format="json")
    assert missing.status_code == 400 and "reason" in missing.json()["errors"]
    blank = {"tenant": org.charlie.pk, "amount": "-2.00", "reason": "  "}
    assert "reason" in client.post(url, blank, format="json").json()["errors"]
    bad = client.post(url, {"tenant": org.charlie.pk, "amount": 2, "reason": "x"}, format="json")
    assert "amount" in bad.json()["errors"]
    body = {"tenant": org.charlie.pk, "amount": "-2.00", "reason": "a faulty node"}
    response = client.post(url, body, format="json")
    assert response.status_code == 201, response.json()
    assert (response.json()["kind"], response.json()["author"]) == ("adjustment", persona)
    assert StatementLine.objects.filter(kind="adjustment").count() == 1
    assert AuditEntry.objects.filter(action="statement.adjust").count() == 1


@pytest.mark.parametrize("persona", ["alice", "tina", "dana"])
def test_others_may_not_close_or_adjust(org: Org, client_for: Any, persona: str) -> None:
    statement = closed(org)
    client = client_for(persona)
    body = {"tenant": org.alpha.pk, "amount": "5.00", "reason": "please"}
    response = client.post(f"/api/v1/statements/{statement.pk}/adjust/", body, format="json")
    assert response.status_code == 403
    response = client.post(
        "/api/v1/statements/close/",
        {"organisation": org.acme.pk, "month": "2031-02"},
        format="json",
    )
    assert response.status_code == 403
    assert StatementLine.objects.filter(kind="adjustment").count() == 0
    assert Statement.objects.count() == 1


def test_finance_closes_a_month_once(org: Org, client_for: Any, monkeypatch: Any) -> None:
    from billing.api import costs

    cluster(org)
    # January as [T0, at(4)) (the cluster's metered hours), closed "now" = at(5).
    monkeypatch.setattr(costs, "month_bounds", lambda text: (T0, at(4)))
    monkeypatch.setattr(timezone, "now", lambda: at(5))
    client = client_for("carol")
    body = {"organisation": org.acme.pk, "month": "2031-01"}
    first = client.post("/api/v1/statements/close/", body, format="json")
    again = client.post("/api/v1/statements/close/", body, format="json")
    assert first.status_code == again.status_code == 201, first.json()
    assert first.json()["id"] == again.json()["id"]
    assert Statement.objects.get().closed_by == org.users["carol"]
    bad = client.post("/api/v1/statements/close/", {**body, "month": "2031-13"}, format="json")
    assert "month" in bad.json()["errors"]
    team = client.post(
        "/api/v1/statements/close/", {**body, "organisation": org.alpha.pk}, format="json"
    )
    assert "organisation" in team.json()["errors"]


def test_a_month_not_metered_is_a_400(org: Org, client_for: Any, monkeypatch: Any) -> None:
    cluster(org)
    monkeypatch.setattr(timezone, "now", lambda: at(24 * 60))  # March 2031: February is over
    body = {"organisation": org.acme.pk, "month": "2031-02"}
    response = client_for("pat").post("/api/v1/statements/close/", body, format="json")
    assert response.status_code == 400
    assert "not metered completely" in response.json()["detail"]


@pytest.mark.parametrize(
    ("month", "message"),
    [
        ("0000-01", "month"),  # no year 0: was a 500
        ("9999-12", "month"),  # its end is in year 10000: was a 500
        ("0001-01", "before the first metered hour"),  # closed an empty statement
        ("2030-12", "before the first metered hour"),
        ("2099-01", "starts after now"),
    ],
)
def test_a_month_outside_the_metered_range_is_a_400(
    org: Org, client_for: Any, month: str, message: str
) -> None:
    cluster(org)  # metered from T0, 2031-01-01
    body = {"organisation": org.acme.pk, "month": month}
    response = client_for("pat").post("/api/v1/statements/close/", body, format="json")
    assert response.status_code == 400, response.content
    assert message in str(response.json())
    assert not Statement.objects.exists()


def test_nothing_closes_before_anything_was_metered(org: Org, client_for: Any) -> None:
    body = {"organisation": org.acme.pk, "month": "2020-01"}
    response = client_for("pat").post("/api/v1/statements/close/", body, format="json")
    assert response.status_code == 400
    assert "nothing has been metered yet" in response.json()["detail"]
    assert not Statement.objects.exists()


def test_the_idle_policy_read_by_finance_set_by_platform_admins(org: Org, client_for: Any) -> None:
    url = f"/api/v1/billing-policies/{org.acme.pk}/"
    assert client_for("carol").get(url).json()["idle_policy"] == "charge"
    assert client_for("carol").put(url, {"idle_policy": "spread"}, format="json").status_code == 403
    for persona in ["alice", "tina", "dana"]:
        assert client_for(persona).get(url).status_code == 404
        assert client_for(persona).get("/api/v1/billing-policies/").json()["results"] == []
    pat = client_for("pat")
    bad = pat.put(url, {"idle_policy": "everyone"}, format="json")
    assert "idle_policy" in bad.json()["errors"]
    response = pat.put(url, {"idle_policy": "showback"}, format="json")
    assert response.status_code == 200, response.json()
    assert BillingPolicy.objects.get(organisation=org.acme).idle_policy == "showback"
    entry = AuditEntry.objects.get(action="billing_policy.set")
    assert (entry.before, entry.after) == ({"idle_policy": "charge"}, {"idle_policy": "showback"})
    team = pat.put(f"/api/v1/billing-policies/{org.alpha.pk}/", {"idle_policy": "spread"})
    assert team.status_code == 404
