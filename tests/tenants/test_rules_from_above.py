"""Budgets, approval (and cost) policies and idle rules set from above a team are not the
team admin's to loosen or remove (issue 34, item 5). tina administers team-alpha, dana its
department (research), carol is finance, pat a platform admin, bob-bravo a member of
another team."""

from __future__ import annotations

from typing import Any

import pytest

from billing.models import Budget
from tenants.idle_rules import rule_for_tenants
from tenants.models import ApprovalPolicy, IdleRule
from tests.conftest import Org

pytestmark = pytest.mark.django_db
BUDGETS = "/api/v1/budgets/"
POLICIES = "/api/v1/approval-policies/"


def budget_body(org: Org, month: str = "2031-02-01", limit: str = "10.00") -> dict[str, Any]:
    return {"tenant": org.alpha.pk, "month": month, "limit": limit, "policy": "notify"}


def test_finances_budget_on_a_team_is_not_the_team_admins_to_raise_or_delete(
    org: Org, client_for: Any
) -> None:
    created = client_for("carol").post(BUDGETS, budget_body(org), format="json")
    assert created.status_code == 201, created.json()
    url = f"{BUDGETS}{created.json()['id']}/"
    assert (created.json()["set_at"], created.json()["set_by"]) == (None, "carol")
    tina = client_for("tina")
    assert tina.get(url).status_code == 200  # she sees it
    raised = tina.patch(url, {"limit": "99999999"}, format="json")
    assert raised.status_code == 403
    assert "set by finance or a platform admin" in raised.json()["detail"]
    assert tina.patch(url, {"policy": "notify"}, format="json").status_code == 403
    assert tina.delete(url).status_code == 403
    assert client_for("dana").patch(url, {"limit": "20"}, format="json").status_code == 403
    assert client_for("bob-bravo").patch(url, {"limit": "20"}, format="json").status_code == 404
    assert str(Budget.objects.get().limit) == "10.00"
    # Finance changes its own budget.
    assert client_for("carol").patch(url, {"limit": "20"}, format="json").status_code == 200


def test_a_team_admin_sets_and_changes_a_budget_of_their_own_and_those_above_may_too(
    org: Org, client_for: Any
) -> None:
    tina = client_for("tina")
    created = tina.post(BUDGETS, budget_body(org, month="2031-03-01"), format="json")
    assert created.status_code == 201
    assert created.json()["set_at"] == org.alpha.pk
    url = f"{BUDGETS}{created.json()['id']}/"
    assert tina.patch(url, {"limit": "5"}, format="json").status_code == 200
    assert client_for("dana").patch(url, {"limit": "4"}, format="json").status_code == 200
    # A department admin's budget on the team is the department's: tina cannot touch it.
    by_dana = client_for("dana").post(BUDGETS, budget_body(org), format="json").json()
    assert by_dana["set_at"] == org.research.pk
    assert tina.delete(f"{BUDGETS}{by_dana['id']}/").status_code == 403
    assert client_for("alice").post(BUDGETS, budget_body(org), format="json").status_code == 403


def test_a_department_admins_cost_rule_on_a_team_cannot_be_deactivated_or_deleted_by_it(
    org: Org, client_for: Any
) -> None:
    rule = {"tenant": org.alpha.pk, "rule": "cost_over", "threshold": 100}
    created = client_for("dana").post(POLICIES, rule, format="json")
    assert created.status_code == 201, created.json()
    assert created.json()["set_at"] == org.research.pk
    url = f"{POLICIES}{created.json()['id']}/"
    tina = client_for("tina")
    off = tina.patch(url, {"active": False}, format="json")
    assert off.status_code == 403
    assert "set by the admins of 'research'" in off.json()["detail"]
    assert tina.patch(url, {"threshold": 1e9}, format="json").status_code == 403
    assert tina.delete(url).status_code == 403
    policy = ApprovalPolicy.objects.get()
    assert (policy.active, float(policy.threshold or 0)) == (True, 100.0)
    # Her own, stricter, rule she adds and changes; dana (above) may change it as well.
    own = tina.post(POLICIES, {**rule, "threshold": 50}, format="json")
    assert own.status_code == 201 and own.json()["set_at"] == org.alpha.pk
    own_url = f"{POLICIES}{own.json()['id']}/"
    assert tina.patch(own_url, {"threshold": 40}, format="json").status_code == 200
    assert client_for("dana").patch(own_url, {"active": False}, format="json").status_code == 200
    assert tina.delete(own_url).status_code == 204


def idle_url(org: Org, name: str = "alpha") -> str:
    return f"/api/v1/tenants/{getattr(org, name).pk}/idle-rule/"


DEPARTMENT = {"threshold_pct": 10, "duration_minutes": 20, "action": "notify_and_stop"}


def test_a_teams_own_idle_rule_may_only_be_stricter_than_the_departments(
    org: Org, client_for: Any
) -> None:
    assert (
        client_for("dana").put(idle_url(org, "research"), DEPARTMENT, format="json").status_code
        == 200
    )
    tina = client_for("tina")
    looser = {"threshold_pct": 5, "duration_minutes": 60, "action": "notify"}
    refused = tina.put(idle_url(org), looser, format="json")
    assert refused.status_code == 400
    errors = refused.json()["errors"]
    assert set(errors) == {"threshold_pct", "duration_minutes", "action"}
    assert "must be at least 10" in errors["threshold_pct"][0]
    assert "must be at most 20" in errors["duration_minutes"][0]
    assert not IdleRule.objects.filter(tenant=org.alpha).exists()
    stricter = {"threshold_pct": 15, "duration_minutes": 10, "action": "notify_and_stop"}
    assert tina.put(idle_url(org), stricter, format="json").status_code == 200
    # The department tightens its rule later: the team's own rule cannot stay looser.
    tighter = {"threshold_pct": 30, "duration_minutes": 15, "action": "notify_and_stop"}
    assert (
        client_for("dana").put(idle_url(org, "research"), tighter, format="json").status_code == 200
    )
    rule = rule_for_tenants([org.alpha.pk])[org.alpha.pk]
    assert (rule.threshold_pct, rule.duration_s) == (30, 600)  # max(15, 30) %, min(10, 15) minutes
    assert tina.get(idle_url(org)).json()["effective"]["threshold_pct"] == 30


def test_an_idle_rule_set_on_the_team_from_above_is_not_the_team_admins(
    org: Org, client_for: Any
) -> None:
    loose = {"threshold_pct": 1, "duration_minutes": 120, "action": "notify"}
    assert (
        client_for("dana").put(idle_url(org), loose, format="json").status_code == 200
    )  # from above: any
    tina = client_for("tina")
    assert tina.put(idle_url(org), DEPARTMENT, format="json").status_code == 403
    assert tina.delete(idle_url(org)).status_code == 403
    assert IdleRule.objects.get(tenant=org.alpha).threshold_pct == 1
    assert rule_for_tenants([org.alpha.pk])[org.alpha.pk].duration_s == 7200
