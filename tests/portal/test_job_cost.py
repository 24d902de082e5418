"""Each job's page shows what it has cost so far: its metered hours rated like statements,
and the time not metered yet at today's rates, as an estimate.

Worked example: 2.00 a GPU-hour, 3.00 from at(2) on. Alice's job holds a whole device and half
of another from at(0) and still runs; hours 0 and 1 are metered (at(3): hour 2 ended less than
the metering delay ago).
- metered: 1.5 GPU x 2 h x 2.00 = 6.00;
- now at(2.5), not metered since at(2): 1.5 GPU x 0.5 h = 0.75 GPU-hour x 3.00 = 2.25.
"""

from __future__ import annotations

import re
from datetime import timedelta
from decimal import Decimal
from typing import Any

import pytest
from django.test import Client
from django.urls import reverse
from django.utils import timezone

from billing.costs.job import job_cost_so_far
from billing.metering.hourly import meter_usage
from billing.rates.cards import RatePrices, rate_card_add
from scheduler.models import JobEvent, JobState
from tests.billing.builders import T0, at, hold, job_for, make_node
from tests.conftest import Org


def running_job(org: Org) -> Any:
    pat = org.users["pat"]
    rate_card_add(
        user=pat, flavor=org.h100, valid_from=T0 - timedelta(days=30), prices=RatePrices(Decimal(2))
    )
    node = make_node("n1", gpus=4)
    job = job_for(org, state=JobState.RUNNING, cpu_milli=0, memory_mib=0)
    hold(job, node, 0, None, [1000, 500])
    meter_usage(now=at(3))
    rate_card_add(user=pat, flavor=org.h100, valid_from=at(2), prices=RatePrices(Decimal(3)))
    return job


def test_cost_so_far_worked_out(org: Org) -> None:
    cost = job_cost_so_far(running_job(org), now=at(2.5))
    assert cost.metered == Decimal("6.00")
    assert [(line.kind, line.quantity, line.rate, line.amount) for line in cost.lines] == [
        ("used", Decimal("3.000000"), Decimal(2), Decimal("6.00"))
    ]
    assert cost.metered_until == at(2)
    assert cost.estimate == Decimal("2.25") and cost.estimate_hours == Decimal("0.75")
    assert cost.total == Decimal("8.25")


def test_a_finished_job_has_no_estimate_once_metered(org: Org) -> None:
    job = running_job(org)
    job.allocations.update(ended_at=at(1.5))
    cost = job_cost_so_far(job, now=at(2.5))
    assert cost.estimate is None
    assert cost.metered == Decimal("6.00")  # metered before the end was written: as metered


def test_preempted_time_is_its_own_line(org: Org) -> None:
    pat = org.users["pat"]
    rate_card_add(
        user=pat, flavor=org.h100, valid_from=T0 - timedelta(days=30), prices=RatePrices(Decimal(2))
    )
    job = job_for(org, cpu_milli=0, memory_mib=0)
    hold(job, make_node("n1", gpus=1), 0, 1, [1000])
    event = JobEvent.objects.create(
        job=job, kind="state", from_state=JobState.RUNNING, to_state=JobState.PREEMPTED
    )
    JobEvent.objects.filter(pk=event.pk).update(at=at(1))
    meter_usage(now=at(3))
    cost = job_cost_so_far(job, now=at(3))
    assert [(line.kind, line.amount) for line in cost.lines] == [("preempted", Decimal("2.00"))]
    assert cost.estimate is None


def test_a_flavor_without_a_rate_is_said_not_hidden(org: Org) -> None:
    job = job_for(org, cpu_milli=0, memory_mib=0)
    hold(job, make_node("n1", gpus=1), 0, None, [1000])
    cost = job_cost_so_far(job, now=at(0.5))
    assert cost.estimate is None and "no rate card" in cost.problem


def page(org: Org, username: str, job: Any, monkeypatch: Any) -> Any:
    monkeypatch.setattr(timezone, "now", lambda: at(2.5))
    client = Client()
    client.force_login(org.users[username])
    return client.get(reverse("portal:job-detail", args=[job.pk]))


def shown(html: str, name: str) -> str:
    found = re.search(rf'id="job-cost-{name}">([^<]*)<', html)
    assert found is not None, name
    return found.group(1)


@pytest.mark.parametrize("username", ["alice", "tina", "dana", "carol", "pat"])
def test_whoever_sees_the_job_sees_its_cost(org: Org, monkeypatch: Any, username: str) -> None:
    job = running_job(org)
    response = page(org, username, job, monkeypatch)
    assert response.status_code == 200
    html = response.content.decode()
    section = html.split('id="job-cost"')[1]
    assert shown(section, "metered") == "6.00"
    assert shown(section, "estimate") == "2.25" and "estimate" in section
    assert shown(section, "total") == "8.25"
    assert re.search(r'<table id="job-cost-lines">.*<td class="num">6.00</td>', section, re.S)


@pytest.mark.parametrize("username", ["chris", "bob-bravo"])
def test_another_tenants_job_page_stays_a_404(org: Org, monkeypatch: Any, username: str) -> None:
    job = running_job(org)
    response = page(org, username, job, monkeypatch)
    assert response.status_code == 404
    assert "6.00" not in response.content.decode()
