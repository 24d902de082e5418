"""A member's waiting job in the browser: where it stands and when it should start, and the
page following the scheduler's next refresh without a reload (issue 20)."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.utils import timezone
from playwright.sync_api import expect

from scheduler.models import JobQueueEstimate
from tests.conftest import Org
from tests.eta_builders import small_queue
from tests.portal.browser.conftest import shoot

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def test_member_sees_the_position_and_estimate_of_their_waiting_job(
    org: Org, page_for: Any
) -> None:
    queue = small_queue(org, timezone.now())
    alice = page_for("alice")
    alice.goto(f"/jobs/{queue.second.pk}/")

    position = alice.locator("#job-queue")
    expect(position).to_contain_text("2 in its team's queue, 3 in the cluster")
    expect(position).to_contain_text("1 of other teams")  # bravo's job: counted, not named
    expect(alice.locator("#job-eta")).to_contain_text("in about 40 minutes")
    expect(alice.locator(f'#job-queue a[href="/jobs/{queue.first.pk}/"]')).to_be_visible()
    expect(alice.locator(f'a[href="/jobs/{queue.bravo.pk}/"]')).to_have_count(0)
    shoot(alice, "job-waiting")

    # The scheduler's next refresh: the two jobs ahead started, this one is next.
    now = timezone.now()
    JobQueueEstimate.objects.filter(job__in=[queue.bravo, queue.first]).delete()
    JobQueueEstimate.objects.filter(job=queue.second).update(
        position_tenant=1,
        position_cluster=1,
        eta_p50=now + timedelta(minutes=5),
        eta_p90=now + timedelta(minutes=20),
        estimated_at=now,
        computed_at=now,
    )
    for job in (queue.bravo, queue.first):
        job.state = "running"
        job.save(update_fields=["state"])
    expect(position).to_contain_text("1 in its team's queue, 1 in the cluster", timeout=20_000)
    expect(alice.locator("#job-eta")).to_contain_text("in about 5 minutes")
