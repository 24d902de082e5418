"""A job's projected cost is its worst case (issue 34, items 4 and 12): every attempt its
retry limit allows at its maximum runtime, an inference job at its most replicas, priced at
the unit prices metering charges (a best-effort job always gets the borrowed discount)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any

import pytest

from billing.budgets import checks as admission
from billing.budgets.spend import BudgetSpend
from billing.costs.projection import job_cost_estimate
from billing.metering.hourly import meter_usage
from billing.models import BudgetReservation
from billing.rates.cards import RatePrices, rate_card_add
from scheduler.models import Job, JobState
from tenants.models import ApprovalPolicy, ApprovalRule
from tests import factories as f
from tests.billing.builders import T0, at, hold, job_for, make_node
from tests.conftest import Org, job_spec

QUOTES = "/api/v1/quotes/"
NOW = datetime(2031, 2, 10, 12, tzinfo=UTC)


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(admission, "clock", lambda: NOW)


def h100_rates(org: Org, discount: str = "0") -> None:
    # 3.00 a GPU-hour, 0.10 a core-hour, 0.02 a GiB-hour.
    prices = RatePrices(Decimal(3), Decimal("0.10"), Decimal("0.02"), Decimal(discount))
    start = datetime(2020, 1, 1, tzinfo=UTC)
    rate_card_add(user=org.users["pat"], flavor=org.h100, valid_from=start, prices=prices)


def retrying(**kw: Any) -> dict[str, Any]:
    # 2 replicas x (4 GPUs x 3.00 + 8 cores x 0.10 + 64 GiB x 0.02 = 14.08) = 28.16 an hour;
    # one attempt of 600 s: 28.16 / 6 = 4.69; 21 attempts: 21 x 600 s = 3.5 h x 28.16 = 98.56.
    return job_spec(max_runtime_s=600, retry={"limit": 20}, **kw)


def test_a_retrying_job_is_quoted_for_every_attempt(org: Org, client_for: Any, clock: None) -> None:
    h100_rates(org)
    body = {"project": org.proj_alpha.pk, "spec": retrying()}
    estimate = client_for("alice").post(QUOTES, body, format="json").json()["estimate"]
    assert estimate["attempts_max"] == 21
    assert estimate["high"] == estimate["worst_case_cost"] == "98.56"
    assert estimate["high_runtime_s"] == 21 * 600
    assert estimate["low"] == "4.69"  # one attempt
    assert "21 attempts (retry limit 20 + 1) of up to 600 s" in estimate["worst_case_note"]
    assert "98.56" in estimate["worst_case_note"]


def test_a_retrying_job_is_reserved_for_every_attempt(
    org: Org, client_for: Any, clock: None
) -> None:
    h100_rates(org)
    body = {"project": org.proj_alpha.pk, "spec": retrying()}
    created = client_for("alice").post("/api/v1/jobs/", body, format="json").json()
    assert created["state"] == JobState.QUEUED
    reservation = BudgetReservation.objects.get(job_id=created["id"])
    assert reservation.amount == Decimal("98.56")
    assert reservation.gpu_hours == Decimal(28)  # 8 GPUs x 600 s x 21 / 3600


@pytest.mark.parametrize(
    ("rule", "threshold", "said"),
    [
        # 98.56 > 50 (one attempt: 4.69); 28 GPU-hours > 10 (one attempt: 1.33).
        (ApprovalRule.COST_OVER, 50, "may cost up to EUR 98.56 over 21 attempts"),
        (ApprovalRule.GPU_HOURS_OVER, 10, "may use up to 28 GPU-hours"),
    ],
    ids=["cost", "gpu-hours"],
)
def test_an_approval_rule_judges_every_attempt(
    org: Org, client_for: Any, clock: None, rule: str, threshold: int, said: str
) -> None:
    h100_rates(org)
    ApprovalPolicy.objects.create(tenant=org.research, rule=rule, threshold=Decimal(threshold))
    body = {"project": org.proj_alpha.pk, "spec": retrying()}
    client = client_for("alice")
    quoted = client.post(QUOTES, body, format="json").json()
    assert quoted["approval"]["needed"] is True
    assert said in quoted["approval"]["reasons"][0]["reason"]
    created = client.post("/api/v1/jobs/", body, format="json").json()
    assert created["state"] == JobState.PENDING_APPROVAL


def test_an_inference_job_is_projected_at_its_most_replicas(org: Org, clock: None) -> None:
    h100_rates(org)
    job = job_for(
        org,
        job_type="inference",
        replicas=1,
        gpu_milli_per_replica=1000,
        cpu_milli=0,
        memory_mib=0,
        flavors=["H100-80GB"],
        max_runtime_s=3600,
        spec={"type": "inference", "min_replicas": 1, "max_replicas": 4},
    )
    estimate = job_cost_estimate(job, at=NOW)
    # Low: 1 replica x 1 GPU x 3.00 for 1 h; high: 4 replicas.
    assert (estimate.low, estimate.high, estimate.replicas_max) == (
        Decimal("3.00"),
        Decimal("12.00"),
        4,
    )
    assert admission.job_projection(job, at=NOW).gpu_hours == Decimal(4)


def test_a_best_effort_job_is_quoted_what_metering_charges(org: Org) -> None:
    """Metering rates a class that does not count against quota as borrowed, so its quote
    takes the borrowed discount too (before: quoted 1.96, charged 1.37)."""
    pat = org.users["pat"]
    prices = RatePrices(Decimal("1.96"), borrowed_discount=Decimal("0.3"))
    rate_card_add(user=pat, flavor=org.h100, valid_from=T0 - timedelta(days=1), prices=prices)
    job = job_for(
        org,
        priority_class=f.priority("best-effort"),
        cpu_milli=0,
        memory_mib=0,
        flavors=["H100-80GB"],
        max_runtime_s=3600,
    )
    quoted = job_cost_estimate(job, at=at(0)).high
    assert quoted == Decimal("1.37")  # 1 GPU-hour x 1.96 x (1 - 0.3) = 1.372
    hold(job, make_node(), 0, 1, [1000])  # the whole maximum runtime
    meter_usage(now=at(2))
    charged = BudgetSpend.objects.get(tenant=org.alpha).amount
    assert charged.quantize(Decimal("0.01")) == quoted
    assert Job.objects.get(pk=job.pk).priority_class.counts_against_quota is False
