"""Usage written after its hour was metered is billed, and nobody has to notice first.

The cluster is tests/billing/test_statements.py's (hours 0-3 metered at at(5); 2.00 a
GPU-hour, 3.00 from hour 2). Two jobs' allocations are then recorded late, in hours already
metered: the next metering run bills them into the open month, the cost API's total and the
job's page include them, and the scheduled reconciliation reports the gap before and none
after. In a month already closed, the late usage becomes an adjustment finance accepts.
"""

from __future__ import annotations

import logging
from datetime import timedelta
from decimal import Decimal
from typing import Any

import pytest
from django.core.exceptions import PermissionDenied
from django.test import Client

from billing.costs.job import job_cost_so_far
from billing.metering.gaps import usage_check
from billing.metering.hourly import meter_usage
from billing.metering.late import proposal_accept, proposals_pending
from billing.models import AdjustmentProposal, LineKind, StatementLine, UsageRecord
from billing.statements.closing import statement_close
from common.errors import DomainError
from scheduler.models import Node
from tests.billing.builders import T0, at, hold, job_for
from tests.billing.test_costs_api import costs
from tests.billing.test_statements import cluster
from tests.conftest import Org
from tests.metrics.helpers import TOKEN


def _late_jobs(org: Org) -> list[Any]:
    """Two jobs whose allocations are recorded after their hours were metered: one GPU over
    hours 1-3 (2.00 + 3.00 + 3.00 = 8.00) and a half GPU over hour 0 (0.5 x 2.00 = 1.00)."""
    n1 = Node.objects.get(name="n1")
    late = job_for(org), job_for(org, "bob-bravo", project=org.proj_bravo)
    hold(late[0], n1, 1, 4, [1000], first_device=3)
    hold(late[1], n1, 0, 1, [500], first_device=1, replica=1)
    return list(late)


def test_late_allocations_are_billed_on_the_next_run(
    org: Org, client_for: Any, caplog: Any
) -> None:
    cluster(org)
    client = client_for("carol")
    before = Decimal(costs(client, by="team", kind="used")["total"]["charged"])
    late = _late_jobs(org)
    # The reconciliation sees what metering has not billed: 3 + 1 allocation-hours.
    with caplog.at_level(logging.ERROR, logger="billing.metering.gaps"):
        assert usage_check(now=at(5), start=T0).gaps == 4
    assert "usage not metered: 4 allocation-hour(s)" in caplog.text
    assert job_cost_so_far(late[0], now=at(5)).metered == Decimal("0.00")

    meter_usage(now=at(5) + timedelta(minutes=1))  # no new hour due: the late ones only

    assert UsageRecord.objects.filter(allocation__job__in=late).count() == 4
    after = Decimal(costs(client, by="team", kind="used")["total"]["charged"])
    assert after - before == Decimal("9.00")
    assert job_cost_so_far(late[0], now=at(5)).metered == Decimal("8.00")
    assert usage_check(now=at(5), start=T0).gaps == 0
    # A second run bills nothing twice.
    meter_usage(now=at(5) + timedelta(minutes=2))
    assert Decimal(costs(client, by="team", kind="used")["total"]["charged"]) == after


def test_late_usage_in_a_closed_month_is_proposed_to_finance(org: Org) -> None:
    cluster(org)
    pat, carol = org.users["pat"], org.users["carol"]
    statement = statement_close(user=pat, organisation=org.acme, start=T0, end=at(4), now=at(5))
    closed = list(statement.lines.values_list("id", "amount"))
    late = _late_jobs(org)

    meter_usage(now=at(5) + timedelta(minutes=1))

    # The closed statement is as it was; each late allocation is a pending proposal.
    assert list(statement.lines.values_list("id", "amount")) == closed
    proposals = {p.allocation.job_id: p for p in proposals_pending(carol)}
    assert {job: p.amount for job, p in proposals.items()} == {
        late[0].pk: Decimal("8.00"),
        late[1].pk: Decimal("1.00"),
    }
    assert (proposals[late[1].pk].tenant, proposals[late[1].pk].project) == (
        org.bravo,
        org.proj_bravo,
    )
    with pytest.raises(PermissionDenied):
        proposals_pending(org.users["alice"])
    # Finance accepts one: an adjustment line through the adjustment service, once.
    accepted = proposal_accept(user=carol, proposal=proposals[late[0].pk])
    line = StatementLine.objects.get(pk=accepted.line_id)
    assert (line.kind, line.amount, line.statement_id, line.author) == (
        LineKind.ADJUSTMENT,
        Decimal("8.00"),
        statement.pk,
        carol,
    )
    with pytest.raises(DomainError):
        proposal_accept(user=carol, proposal=accepted)
    assert AdjustmentProposal.objects.filter(state="pending").count() == 1
    assert usage_check(now=at(5), start=T0).gaps == 0


def test_the_reconciliation_is_scheduled_and_on_metrics(
    org: Org, client_for: Any, settings: Any
) -> None:
    from billing.tasks import usage_reconcile

    assert settings.CELERY_BEAT_SCHEDULE["billing-usage-reconcile"]["task"] == usage_reconcile.name
    cluster(org)
    _late_jobs(org)
    usage_check(now=at(5), start=T0)
    settings.GANTRY_METRICS_TOKEN = TOKEN
    response = Client(headers={"Authorization": f"Bearer {TOKEN}"}).get("/metrics")
    assert response.status_code == 200
    assert "gantry_billing_usage_gaps 4.0" in response.content.decode()


def test_finance_accepts_a_proposal_through_the_api(org: Org, client_for: Any) -> None:
    cluster(org)
    statement = statement_close(
        user=org.users["pat"], organisation=org.acme, start=T0, end=at(4), now=at(5)
    )
    late = _late_jobs(org)
    meter_usage(now=at(5) + timedelta(minutes=1))
    carol = client_for("carol")
    url = f"/api/v1/statements/{statement.pk}/"
    listed = carol.get(url + "proposals/").json()["results"]
    assert {(p["job"], p["amount"], p["state"]) for p in listed} == {
        (late[0].pk, "8.00", "pending"),
        (late[1].pk, "1.00", "pending"),
    }
    first = next(p["id"] for p in listed if p["job"] == late[0].pk)
    # A member of the organisation reads the statement but neither lists nor accepts.
    alice = client_for("alice")
    assert alice.get(url + "proposals/").status_code == 403
    assert (
        alice.post(url + "accept-proposal/", {"proposal": first}, format="json").status_code == 403
    )
    accepted = carol.post(url + "accept-proposal/", {"proposal": first}, format="json")
    assert accepted.status_code == 201, accepted.json()
    assert (accepted.json()["kind"], accepted.json()["amount"]) == ("adjustment", "8.00")
    again = carol.post(url + "accept-proposal/", {"proposal": first}, format="json")
    assert again.status_code == 409
    assert [p["job"] for p in carol.get(url + "proposals/").json()["results"]] == [late[1].pk]
    unknown = carol.post(url + "accept-proposal/", {"proposal": 10**6}, format="json")
    assert unknown.status_code == 400 and "proposal" in str(unknown.json())
