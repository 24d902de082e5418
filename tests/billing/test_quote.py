"""Quote before submit (issue 18): `POST /api/v1/quotes/` prices and judges the job a submit
would create, validates it as submit does, and creates nothing."""

from __future__ import annotations

from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from billing.budgets import checks as admission
from billing.models import Budget, BudgetPolicy, BudgetReservation, BudgetSpend
from billing.rates.cards import RatePrices, rate_card_add
from scheduler.jobs.services import job_submit
from scheduler.models import Job, JobEvent, JobState
from tenants.approval_policies import policy_set
from tenants.models import ApprovalPolicy, ApprovalRequest, ApprovalRule, AuditEntry
from tests.conftest import Org, job_spec

QUOTES = "/api/v1/quotes/"


def rates(org: Org) -> None:
    # H100: 3.00 a GPU-hour, 0.10 a core-hour, 0.02 a GiB-hour; A100: 1.00 a GPU-hour.
    start = datetime(2020, 1, 1, tzinfo=UTC)
    h100 = RatePrices(Decimal(3), Decimal("0.10"), Decimal("0.02"))
    rate_card_add(user=org.users["pat"], flavor=org.h100, valid_from=start, prices=h100)
    rate_card_add(
        user=org.users["pat"], flavor=org.a100, valid_from=start, prices=RatePrices(Decimal(1))
    )


def rows() -> dict[str, int]:
    return {
        model.__name__: model.objects.count()
        for model in (Job, JobEvent, ApprovalRequest, AuditEntry, BudgetReservation)
    }


def quote(client: Any, body: dict[str, Any], status: int = 200) -> Any:
    response = client.post(QUOTES, body, format="json")
    assert response.status_code == status, response.json()
    return response.json()


def test_a_quote_prices_the_job_worked_out_and_creates_nothing(org: Org, client_for: Any) -> None:
    rates(org)
    before = rows()
    spec = job_spec(
        flavors=["H100-80GB", "A100-40GB"],
        max_runtime_s=7200,
        estimated_runtime_s=3600,
        resources={"gpus": 1, "cpu_milli": 4000, "memory_mib": 8192},
    )
    body = quote(client_for("alice"), {"project": org.proj_alpha.pk, "spec": spec})
    # Two replicas. H100 per hour: 2 GPUs x 3.00 + 8 cores x 0.10 + 16 GiB x 0.02 = 7.12;
    # A100 per hour: 2 GPUs x 1.00 = 2.00. Low: 1 h on A100 = 2.00; high: 2 h on H100 = 14.24.
    estimate = body["estimate"]
    assert (estimate["low"], estimate["high"]) == ("2.00", "14.24")
    assert (estimate["per_hour_low"], estimate["per_hour_high"]) == ("2.00", "7.12")
    assert (estimate["low_runtime_s"], estimate["high_runtime_s"]) == (3600, 7200)
    assert len(estimate["currency"]) == 3
    assert body["approval"] == {"needed": False, "reasons": []}
    assert body["budget"] is None
    assert body["fits"] is True and body["refused"] is None
    assert body["job"]["gpus_total"] == 2 and body["job"]["priority_class"]
    assert rows() == before


def test_a_quote_needing_approval_says_why_and_submit_then_agrees(
    org: Org, client_for: Any
) -> None:
    rates(org)
    policy_set(user=org.users["tina"], tenant=org.alpha, rule="gpus_over", threshold=4)
    client = client_for("alice")
    big = {"project": org.proj_alpha.pk, "spec": job_spec()}  # 2 x 4 GPUs
    small = {"project": org.proj_alpha.pk, "spec": job_spec(name="small", replicas=1)}
    before = rows()
    big_quote, small_quote = quote(client, big), quote(client, small)
    assert rows() == before
    assert big_quote["approval"]["needed"] is True
    assert [r["rule"] for r in big_quote["approval"]["reasons"]] == ["gpus_over"]
    assert "8" in big_quote["approval"]["reasons"][0]["reason"]
    assert small_quote["approval"] == {"needed": False, "reasons": []}
    for body, said in [(big, big_quote), (small, small_quote)]:
        submitted = client.post("/api/v1/jobs/", body, format="json").json()
        needed = submitted["state"] == JobState.PENDING_APPROVAL
        assert needed == said["approval"]["needed"], submitted


def test_the_borrowing_rule_and_budgets_are_judged_without_a_lock_or_a_write(
    org: Org, client_for: Any, clock: None
) -> None:
    """The submit locks the tenant's row to judge borrowing, and the month's budgets over
    the job; a quote must not (it decides nothing, and outside a transaction SELECT ... FOR
    UPDATE is an error on PostgreSQL)."""
    Budget.objects.create(tenant=org.research, month=FEB, limit=Decimal(10**6))
    policy_set(user=org.users["tina"], tenant=org.alpha, rule="borrowing")
    alice = org.users["alice"]
    job_submit(user=alice, project=org.proj_alpha, payload=job_spec(name="first"))  # 8 of 16
    client = client_for("alice")
    body = {"project": org.proj_alpha.pk, "spec": job_spec(name="second", replicas=3)}
    with CaptureQueriesContext(connection) as queries:
        said = quote(client, body)
    sql = [q["sql"].upper() for q in queries.captured_queries]
    assert not [s for s in sql if "FOR UPDATE" in s], sql
    assert not [s for s in sql if s.startswith(("INSERT", "UPDATE", "DELETE"))], sql
    assert [r["rule"] for r in said["approval"]["reasons"]] == ["borrowing"]  # 8 + 12 > 16
    assert said["budget"]["tenant"] == "research"
    submitted = client.post("/api/v1/jobs/", body, format="json").json()
    assert submitted["state"] == JobState.PENDING_APPROVAL


@pytest.mark.parametrize(
    "spec",
    [
        job_spec(replicas=0),
        job_spec(resources={"gpus": 4, "cpu_milli": -1, "memory_mib": 1}),
        job_spec(flavors=["No-Such-GPU"]),
        job_spec(replicas=64),  # beyond every quota: can never run
        {"name": "x"},
    ],
    ids=["zero-replicas", "negative-cpu", "unknown-flavor", "never-fits", "missing-fields"],
)
def test_a_bad_spec_is_the_same_400_as_at_submit(
    org: Org, client_for: Any, spec: dict[str, Any]
) -> None:
    client = client_for("alice")
    body = {"project": org.proj_alpha.pk, "spec": spec}
    before = rows()
    quoted = client.post(QUOTES, body, format="json")
    submitted = client.post("/api/v1/jobs/", body, format="json")
    assert quoted.status_code == submitted.status_code == 400
    assert quoted.json() == submitted.json()
    assert set(quoted.json()) >= {"detail", "errors"}
    assert rows() == before


def test_a_bad_envelope_is_the_same_400_as_at_submit(org: Org, client_for: Any) -> None:
    client = client_for("alice")
    for body in [{"spec": job_spec()}, {"project": org.proj_alpha.pk, "spec": [], "x": 1}]:
        quoted = client.post(QUOTES, body, format="json")
        submitted = client.post("/api/v1/jobs/", body, format="json")
        assert quoted.status_code == submitted.status_code == 400
        assert quoted.json() == submitted.json()


@pytest.mark.parametrize(
    ("persona", "project", "status"),
    [
        ("alice", "proj_bravo", 404),  # another team's project: not there for alice
        ("chris", "proj_alpha", 404),
        ("carol", "proj_alpha", 403),  # finance sees it but does not submit
    ],
)
def test_a_project_the_user_cannot_submit_to_is_the_error_submit_gives(
    org: Org, client_for: Any, persona: str, project: str, status: int
) -> None:
    client = client_for(persona)
    body = {"project": getattr(org, project).pk, "spec": job_spec()}
    before = rows()
    quoted = client.post(QUOTES, body, format="json")
    submitted = client.post("/api/v1/jobs/", body, format="json")
    assert quoted.status_code == submitted.status_code == status
    assert quoted.json() == submitted.json()
    assert rows() == before


def test_an_idempotency_key_in_the_body_is_accepted_and_reserves_nothing(
    org: Org, client_for: Any
) -> None:
    client = client_for("alice")
    body = {"project": org.proj_alpha.pk, "spec": job_spec(), "idempotency_key": "k-1"}
    quote(client, body)
    created = client.post("/api/v1/jobs/", body, format="json")
    assert created.status_code == 201, created.json()


# --- budgets and cost rules: the quote says what submit then does ---------------------------

FEB = datetime(2031, 2, 1, tzinfo=UTC)
NOW = datetime(2031, 2, 10, 12, tzinfo=UTC)


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(admission, "clock", lambda: NOW)


def hours_spec(hours: int, **kw: Any) -> dict[str, Any]:
    # 2 replicas x (4 H100 x 3.00 + 8 cores x 0.10 + 64 GiB x 0.02 = 14.08) = 28.16 an hour.
    return job_spec(max_runtime_s=hours * 3600, **kw)


def quote_then_submit(client: Any, org: Org, spec: dict[str, Any]) -> tuple[Any, Any]:
    body = {"project": org.proj_alpha.pk, "spec": spec}
    before = rows()
    said = quote(client, body)
    assert rows() == before
    return said, client.post("/api/v1/jobs/", body, format="json").json()


def test_a_quote_shows_the_budget_left_before_and_after_the_job(
    org: Org, client_for: Any, clock: None
) -> None:
    rates(org)
    Budget.objects.create(tenant=org.research, month=FEB, limit=Decimal("1000.00"))
    BudgetSpend.objects.create(tenant=org.bravo, month=FEB, amount=Decimal("100.50"))
    said = quote(client_for("alice"), {"project": org.proj_alpha.pk, "spec": hours_spec(10)})
    budget = said["budget"]
    # research's budget (team-alpha has none of its own): 1000.00 - 100.50 spent by bravo.
    assert budget["tenant"] == "research" and budget["unit"] == "money"
    assert (budget["limit"], budget["spent"], budget["committed"]) == ("1000.00", "100.50", "0.00")
    assert budget["remaining"] == "899.50"
    assert budget["job_projected"] == "281.60"  # 10 h x 28.16
    assert budget["remaining_after"] == "617.90"
    assert said["estimate"]["high"] == "281.60"
    assert said["approval"]["needed"] is False


def test_a_quote_a_hard_budget_would_refuse_is_a_200_saying_why_and_submit_agrees(
    org: Org, client_for: Any, clock: None
) -> None:
    """A quote is a question, not a submit: it was submit's 409 ("Refused at submit: ...
    Nothing was created"), which told neither the price nor the budget's figures."""
    rates(org)
    Budget.objects.create(tenant=org.alpha, month=FEB, limit=Decimal(10_000))  # notify
    Budget.objects.create(
        tenant=org.research, month=FEB, limit=Decimal(100), policy=BudgetPolicy.HARD
    )
    BudgetSpend.objects.create(tenant=org.bravo, month=FEB, amount=Decimal("20.00"))
    client = client_for("alice")
    body = {"project": org.proj_alpha.pk, "spec": hours_spec(10)}
    before = rows()
    said = quote(client, body)
    assert rows() == before
    submitted = client.post("/api/v1/jobs/", body, format="json")
    assert submitted.status_code == 409
    # The refusal in submit's own words, and the refusing budget (research's, an ancestor's,
    # not the nearest: team-alpha's) as it stands: 20.00 spent of 100.00, and the job's
    # worst case of 10 h x 28.16 = 281.60 leaves 100.00 - 20.00 - 281.60 = -201.60.
    refused = said["refused"]
    assert refused["reason"] == submitted.json()["detail"]
    assert "research's budget for 2031-02" in refused["reason"] and "is hard" in refused["reason"]
    budget = refused["budget"]
    assert (budget["tenant"], budget["policy"], budget["unit"]) == ("research", "hard", "money")
    assert (budget["limit"], budget["spent"], budget["committed"]) == ("100.00", "20.00", "0.00")
    assert (budget["job_projected"], budget["remaining_after"]) == ("281.60", "-201.60")
    assert said["budget"]["tenant"] == "team-alpha"
    assert said["estimate"]["high"] == "281.60"
    assert said["approval"] == {"needed": False, "reasons": []}  # submit stops at the refusal
    # A job within the budget is quoted as taken, and taken: 20.00 + 2 h x 28.16 = 76.32.
    fits = {"project": org.proj_alpha.pk, "spec": hours_spec(2, name="short")}
    assert quote(client, fits)["refused"] is None
    assert client.post("/api/v1/jobs/", fits, format="json").status_code == 201


def test_a_quote_over_an_approval_budget_needs_approval_and_submit_agrees(
    org: Org, client_for: Any, clock: None
) -> None:
    rates(org)
    Budget.objects.create(
        tenant=org.alpha, month=FEB, limit=Decimal(500), policy=BudgetPolicy.APPROVAL
    )
    client = client_for("alice")
    under, submitted = quote_then_submit(client, org, hours_spec(10, name="under"))  # 281.60
    assert under["approval"]["needed"] is False
    assert submitted["state"] == JobState.QUEUED
    over, submitted = quote_then_submit(client, org, hours_spec(10, name="over"))  # + 281.60
    assert over["approval"]["needed"] is True
    (reason,) = over["approval"]["reasons"]
    assert reason["rule"] == "budget"
    assert "to 112.6 %" in reason["reason"]  # (281.60 + 281.60) / 500
    assert over["budget"]["committed"] == "281.60" and over["budget"]["remaining"] == "218.40"
    assert submitted["state"] == JobState.PENDING_APPROVAL
    assert reason["reason"] in submitted["reason"]


def test_a_quote_over_a_best_effort_budget_says_the_class_it_would_run_at(
    org: Org, client_for: Any, clock: None
) -> None:
    rates(org)
    Budget.objects.create(
        tenant=org.alpha, month=FEB, limit=Decimal(100), policy=BudgetPolicy.BEST_EFFORT
    )
    said, submitted = quote_then_submit(client_for("alice"), org, hours_spec(10))
    assert said["job"]["priority_class"] == submitted["priority_class"] == "best-effort"
    assert "runs at best-effort" in said["job"]["priority_note"]
    assert said["approval"]["needed"] is False and submitted["state"] == JobState.QUEUED


def test_a_quote_over_the_cost_rule_needs_approval_and_submit_agrees(
    org: Org, client_for: Any, clock: None
) -> None:
    rates(org)
    ApprovalPolicy.objects.create(
        tenant=org.research, rule=ApprovalRule.COST_OVER, threshold=Decimal(100)
    )
    said, submitted = quote_then_submit(client_for("alice"), org, hours_spec(4))  # 112.64
    assert [r["rule"] for r in said["approval"]["reasons"]] == ["cost_over"]
    assert "may cost up to" in said["approval"]["reasons"][0]["reason"]
    assert submitted["state"] == JobState.PENDING_APPROVAL
