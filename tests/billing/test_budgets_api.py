"""The budgets API: who manages which budgets, what a read shows, and bad input."""

from __future__ import annotations

from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

import pytest

from billing.models import Budget, BudgetAlert, BudgetReservation, BudgetSpend
from tenants.models import AuditEntry
from tests import factories as f
from tests.conftest import Org

FEB = datetime(2031, 2, 1, tzinfo=UTC)
URL = "/api/v1/budgets/"


def body(org: Org, **kw: Any) -> dict[str, Any]:
    data = {"tenant": org.alpha.pk, "month": "2031-02-01", "limit": "1000"}
    data.update(kw)
    return data


def budget(tenant: Any, limit: str = "1000", **kw: Any) -> Budget:
    return Budget.objects.create(
        tenant=tenant, month=kw.pop("month", FEB), limit=Decimal(limit), **kw
    )


@pytest.mark.parametrize("persona", ["tina", "dana", "carol", "pat"])
def test_admins_of_the_tenant_or_above_finance_and_platform_admins_create_budgets(
    org: Org, client_for: Any, persona: str
) -> None:
    response = client_for(persona).post(URL, body(org, policy="approval"), format="json")
    assert response.status_code == 201, response.json()
    data = response.json()
    assert (data["tenant_slug"], data["month"], data["unit"], data["currency"]) == (
        "team-alpha",
        "2031-02-01",
        "money",
        "EUR",
    )
    assert (data["limit"], data["policy"]) == ("1000.00", "approval")
    assert data["position"] == {
        "spent": "0.00",
        "committed": "0.00",
        "remaining": "1000.00",
        "percent": "0.0",
    }
    entry = AuditEntry.objects.get(action="budget.create")
    assert entry.actor == org.users[persona] and entry.after["limit"] == "1000.00"


def test_a_member_may_not_create_a_budget_of_their_team(org: Org, client_for: Any) -> None:
    response = client_for("alice").post(URL, body(org), format="json")
    assert response.status_code == 403
    assert not Budget.objects.exists()


def test_a_budget_on_a_tenant_the_user_cannot_see_is_refused_and_changes_nothing(
    org: Org, client_for: Any
) -> None:
    response = client_for("bob-bravo").post(URL, body(org), format="json")
    assert response.status_code == 400
    assert "tenant" in response.json()["errors"]
    assert "alpha" not in response.content.decode()
    assert not Budget.objects.exists() and not AuditEntry.objects.exists()


@pytest.mark.parametrize(
    ("field", "value", "words"),
    [
        ("limit", "-5", "must not be negative"),
        ("limit", "1e3", "decimal number"),
        ("limit", "NaN", "decimal number"),
        ("limit", 1000, "in a string"),
        ("limit", "10.005", "at most 2 decimal places"),
        ("unit", "euros", "not a valid choice"),
        ("policy", "pray", "not a valid choice"),
        ("month", "2031-02-15", "first day of a month"),
        ("month", "2031-02", "wrong format"),
        ("tenant", 999999, "does not exist"),
    ],
    ids=lambda v: str(v),
)
def test_bad_input_is_a_400_naming_the_field(
    org: Org, client_for: Any, field: str, value: Any, words: str
) -> None:
    response = client_for("tina").post(URL, body(org, **{field: value}), format="json")
    assert response.status_code == 400, response.json()
    errors = response.json()["errors"]
    assert words in " ".join(errors[field]), errors
    assert not Budget.objects.exists()


def test_a_second_budget_for_the_same_tenant_and_month_is_a_conflict(
    org: Org, client_for: Any
) -> None:
    budget(org.alpha)
    response = client_for("tina").post(URL, body(org), format="json")
    assert response.status_code == 409
    assert "already" in response.json()["detail"]


def test_reads_show_the_position_and_lists_filter(org: Org, client_for: Any) -> None:
    alpha = budget(org.alpha, "100")
    budget(org.research, "500")
    budget(org.alpha, "50", month=datetime(2031, 3, 1, tzinfo=UTC))
    BudgetSpend.objects.create(tenant=org.alpha, month=FEB, amount=Decimal("20.004"))
    BudgetSpend.objects.create(tenant=org.bravo, month=FEB, amount=Decimal("5"))
    job = f.JobFactory(project=org.proj_alpha, submitted_by=org.users["alice"])
    BudgetReservation.objects.create(
        job=job,
        tenant=org.alpha,
        amount=Decimal(60),
        gpu_hours=Decimal(15),
        metered=Decimal(10),
        created_at=FEB,
    )
    client = client_for("dana")
    detail = client.get(f"{URL}{alpha.pk}/").json()
    # spent 20.00; committed 60 - 10 metered = 50.00; 70 of 100.
    assert detail["position"] == {
        "spent": "20.00",
        "committed": "50.00",
        "remaining": "30.00",
        "percent": "70.0",
    }
    listed = client.get(URL, {"month": "2031-02-01"}).json()["results"]
    assert [(b["tenant_slug"], b["position"]["spent"]) for b in listed] == [
        ("research", "25.00"),  # alpha's and bravo's
        ("team-alpha", "20.00"),
    ]
    assert listed[1]["position"] == detail["position"]  # the list's figures are the detail's
    by_tenant = client.get(URL, {"tenant": org.alpha.pk}).json()["results"]
    assert [b["month"] for b in by_tenant] == ["2031-03-01", "2031-02-01"]
    assert client.get(URL, {"month": "2031-02-31"}).status_code == 400


def test_a_list_reads_the_positions_in_a_few_queries(
    org: Org, client_for: Any, django_assert_max_num_queries: Any
) -> None:
    for tenant in (org.acme, org.research, org.product, org.alpha, org.bravo, org.charlie):
        budget(tenant)
    client = client_for("carol")
    with django_assert_max_num_queries(8):
        assert len(client.get(URL).json()["results"]) == 6


def test_members_read_their_teams_budget_and_nothing_else(org: Org, client_for: Any) -> None:
    budget(org.alpha)
    bravo = budget(org.bravo)
    budget(org.research)
    client = client_for("alice")
    assert [b["tenant_slug"] for b in client.get(URL).json()["results"]] == ["team-alpha"]
    assert client.get(f"{URL}{bravo.pk}/").status_code == 404
    assert client.patch(f"{URL}{bravo.pk}/", {"limit": "1"}, format="json").status_code == 404
    assert client.delete(f"{URL}{bravo.pk}/").status_code == 404
    assert Budget.objects.filter(pk=bravo.pk, limit=1000).exists()


def test_update_changes_the_limit_and_policy_audited_and_forgets_unreached_alerts(
    org: Org, client_for: Any
) -> None:
    alpha = budget(org.alpha, "100", set_at=org.alpha)  # set by team-alpha's admins
    BudgetSpend.objects.create(tenant=org.alpha, month=FEB, amount=Decimal(90))
    for threshold in (50, 80):
        BudgetAlert.objects.create(budget=alpha, threshold=threshold, percent=90, created_at=FEB)
    assert (
        client_for("alice").patch(f"{URL}{alpha.pk}/", {"limit": "1"}, format="json").status_code
        == 403
    )
    response = client_for("tina").patch(
        f"{URL}{alpha.pk}/", {"limit": "150.50", "policy": "best-effort"}, format="json"
    )
    assert response.status_code == 200, response.json()
    assert (response.json()["limit"], response.json()["policy"]) == ("150.50", "best-effort")
    assert response.json()["position"]["percent"] == "59.8"  # 90 / 150.50
    # 59.8 % is under 80: that alert goes out again when reached; 50 % stays sent.
    assert list(BudgetAlert.objects.values_list("threshold", flat=True)) == [50]
    entry = AuditEntry.objects.get(action="budget.update")
    assert (entry.before["limit"], entry.after["limit"]) == ("100.00", "150.50")
    bad = client_for("tina").patch(f"{URL}{alpha.pk}/", {"unit": "gpu_hours"}, format="json")
    assert bad.status_code == 400 and "unit" in bad.json()["errors"]


def test_delete_is_audited(org: Org, client_for: Any) -> None:
    alpha = budget(org.alpha, set_at=org.alpha)  # set by team-alpha's admins
    assert client_for("alice").delete(f"{URL}{alpha.pk}/").status_code == 403
    assert client_for("tina").delete(f"{URL}{alpha.pk}/").status_code == 204
    assert not Budget.objects.exists()
    assert AuditEntry.objects.get(action="budget.delete").before["limit"] == "1000.00"


# --- the tenant's webhook, the cost rule's policies ------------------------------------------


def test_only_a_tenant_admin_sets_the_webhook_and_only_an_https_one(
    org: Org, client_for: Any
) -> None:
    url = f"/api/v1/tenants/{org.alpha.pk}/"
    for bad in ["http://hooks.example.com/a", "ftp://hooks.example.com/a", "not a url"]:
        response = client_for("tina").patch(url, {"webhook_url": bad}, format="json")
        assert response.status_code == 400, response.json()
        assert "webhook_url" in response.json()["errors"]
    assert (
        client_for("alice")
        .patch(url, {"webhook_url": "https://x.example.com/h"}, format="json")
        .status_code
        == 403
    )
    org.alpha.refresh_from_db()
    assert org.alpha.webhook_url == ""
    good = client_for("tina").patch(
        url, {"webhook_url": "https://hooks.example.com/a"}, format="json"
    )
    assert good.status_code == 200, good.json()
    org.alpha.refresh_from_db()
    assert org.alpha.webhook_url == "https://hooks.example.com/a"


def test_an_estimated_cost_over_n_policy_is_created_through_the_api(
    org: Org, client_for: Any
) -> None:
    url = "/api/v1/approval-policies/"
    body = {"tenant": org.alpha.pk, "rule": "cost_over", "threshold": 250.5}
    response = client_for("tina").post(url, body, format="json")
    assert response.status_code == 201, response.json()
    assert response.json()["summary"] == "estimated cost over EUR 250.5"
    missing = client_for("tina").post(url, {**body, "threshold": None}, format="json")
    assert missing.status_code == 400 and "threshold" in missing.json()["errors"]
