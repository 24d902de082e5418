"""A `hard` budget refuses a job at submit and at approval, and approving a job judges the
budgets again at that moment (issue 34, items 5 and 9).

February 2031; H100 costs 4.00 a GPU-hour: the default spec (2 replicas x 4 GPUs) costs
32.00 an hour, so 10 hours are 320.00.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any

import pytest

from billing.budgets import checks as admission
from billing.models import Budget, BudgetPolicy, BudgetReservation, BudgetSpend
from billing.rates.cards import RatePrices, rate_card_add
from scheduler.models import Job, JobEvent, JobState
from tenants.models import ApprovalPolicy, ApprovalRequest, ApprovalRule, AuditEntry
from tests.conftest import Org, job_spec

FEB = datetime(2031, 2, 1, tzinfo=UTC)
NOW = datetime(2031, 2, 10, 12, tzinfo=UTC)


@pytest.fixture(autouse=True)
def clock(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(admission, "clock", lambda: NOW)


@pytest.fixture
def h100(org: Org) -> None:
    rate_card_add(
        user=org.users["pat"],
        flavor=org.h100,
        valid_from=NOW - timedelta(days=30),
        prices=RatePrices(Decimal(4)),
    )


def rows() -> dict[str, int]:
    return {
        model.__name__: model.objects.count()
        for model in (Job, JobEvent, ApprovalRequest, AuditEntry, BudgetReservation)
    }


def body(org: Org, hours: float, **kw: Any) -> dict[str, Any]:
    return {"project": org.proj_alpha.pk, "spec": job_spec(max_runtime_s=int(hours * 3600), **kw)}


def test_a_hard_budget_refuses_at_submit_naming_the_budget_spend_and_worst_case(
    org: Org, client_for: Any, h100: None
) -> None:
    budget = Budget.objects.create(
        tenant=org.alpha, month=FEB, limit=Decimal(1000), policy=BudgetPolicy.HARD
    )
    BudgetSpend.objects.create(tenant=org.alpha, month=FEB, amount=Decimal(990))  # 99 %
    client = client_for("alice")
    before = rows()
    # One attempt of 1 h costs 32.00; with two retries the worst case is 3 x 32.00 = 96.00.
    spec = body(org, 1, retry={"limit": 2})
    refused = client.post("/api/v1/jobs/", spec, format="json")
    assert refused.status_code == 409, refused.json()
    detail = refused.json()["detail"]
    assert f"team-alpha's budget for 2031-02 (budget {budget.pk}) is hard" in detail
    assert "EUR 990.00 spent" in detail and "of EUR 1,000.00" in detail
    assert "may cost up to EUR 96.00 (its worst case)" in detail
    assert "to 108.6 %" in detail  # (990 + 96) / 1000
    assert rows() == before
    # A quote says the same (a question, not a submit: a 200), and a job that fits is taken.
    quoted = client.post("/api/v1/quotes/", spec, format="json")
    assert quoted.status_code == 200
    assert quoted.json()["refused"]["reason"] == detail
    small = client.post("/api/v1/jobs/", body(org, 0.25), format="json")  # 8.00
    assert small.status_code == 201 and small.json()["state"] == JobState.QUEUED


def test_a_hard_budget_of_an_ancestor_refuses_too(org: Org, client_for: Any, h100: None) -> None:
    Budget.objects.create(
        tenant=org.research, month=FEB, limit=Decimal(100), policy=BudgetPolicy.HARD
    )
    refused = client_for("alice").post("/api/v1/jobs/", body(org, 10), format="json")
    assert refused.status_code == 409
    assert "research's budget for 2031-02" in refused.json()["detail"]
    assert not Job.objects.exists()


def approve(client: Any, job_id: int) -> Any:
    request = ApprovalRequest.objects.get(kind="job", subject_id=job_id)
    return client.post(f"/api/v1/approval-requests/{request.pk}/approve/", {}, format="json")


@pytest.mark.parametrize("policy", [BudgetPolicy.HARD, BudgetPolicy.APPROVAL])
def test_two_approvals_that_together_overrun_a_budget_the_second_is_refused(
    org: Org, client_for: Any, h100: None, policy: str
) -> None:
    """Each job fits the budget alone when submitted (a job waiting for approval reserves
    nothing); the cost rule sends both to approval. Approving the first reserves 320.00;
    approving the second would take the budget to 640.00 of 500.00."""
    Budget.objects.create(tenant=org.alpha, month=FEB, limit=Decimal(500), policy=policy)
    ApprovalPolicy.objects.create(
        tenant=org.research, rule=ApprovalRule.COST_OVER, threshold=Decimal(100)
    )
    alice, tina = client_for("alice"), client_for("tina")
    first = alice.post("/api/v1/jobs/", body(org, 10, name="first"), format="json").json()
    second = alice.post("/api/v1/jobs/", body(org, 10, name="second"), format="json").json()
    assert first["state"] == second["state"] == JobState.PENDING_APPROVAL
    assert approve(tina, first["id"]).status_code == 200
    refused = approve(tina, second["id"])
    assert refused.status_code == 409, refused.json()
    assert (
        "team-alpha's budget for 2031-02 to 128 % (EUR 640.00 of 500.00)"
        in (refused.json()["detail"])
    )
    # Nothing changed: the request is still pending, the job waits, nothing is reserved.
    request = ApprovalRequest.objects.get(kind="job", subject_id=second["id"])
    assert request.state == "pending"
    assert Job.objects.get(pk=second["id"]).state == JobState.PENDING_APPROVAL
    assert not BudgetReservation.objects.filter(job_id=second["id"]).exists()
    # Rejecting it still works.
    request_id = request.pk
    rejected = tina.post(f"/api/v1/approval-requests/{request_id}/reject/", {}, format="json")
    assert rejected.status_code == 200


def test_a_best_effort_budget_full_at_approval_queues_the_job_at_best_effort(
    org: Org, client_for: Any, h100: None
) -> None:
    Budget.objects.create(
        tenant=org.alpha, month=FEB, limit=Decimal(500), policy=BudgetPolicy.BEST_EFFORT
    )
    ApprovalPolicy.objects.create(
        tenant=org.research, rule=ApprovalRule.COST_OVER, threshold=Decimal(100)
    )
    alice, tina = client_for("alice"), client_for("tina")
    first = alice.post("/api/v1/jobs/", body(org, 10, name="first"), format="json").json()
    second = alice.post("/api/v1/jobs/", body(org, 10, name="second"), format="json").json()
    assert approve(tina, first["id"]).status_code == 200
    assert approve(tina, second["id"]).status_code == 200
    job = Job.objects.get(pk=second["id"])
    assert (job.state, job.priority_class.name) == (JobState.QUEUED, "best-effort")
    assert JobEvent.objects.filter(job=job, kind="priority_class").exists()
    assert Job.objects.get(pk=first["id"]).priority_class.name == "normal"
