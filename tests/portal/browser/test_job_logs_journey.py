"""A member opens their running job: its pods and its log in the panel, which follows the
log until the job ends (issue 20)."""

from __future__ import annotations

from typing import Any

import pytest
from django.utils import timezone
from playwright.sync_api import expect

from scheduler.models import Allocation, Job, JobState
from tests.conftest import Org
from tests.pod_builders import requeued_job
from tests.portal.browser.conftest import shoot

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def test_member_reads_and_follows_their_running_jobs_log(org: Org, page_for: Any) -> None:
    setup = requeued_job(org, timezone.now())
    alice = page_for("alice")
    alice.goto(f"/jobs/{setup.job.pk}/")
    panel = alice.locator("#job-logs")
    expect(panel.locator("#job-pods")).to_contain_text("node-b")
    expect(panel.locator("#log-lines .log-line").last).to_contain_text("[rank0]")
    expect(panel.locator("#log-lines")).to_contain_text("loss")
    expect(panel.locator("#log-poll")).to_contain_text("following")
    shoot(alice, "job-logs")
    # The other replica, from the picker.
    panel.locator("select[name=replica]").select_option("1")
    expect(alice.locator("#log-pod")).to_contain_text(f"gantry-{setup.job.pk}-a1-r1")
    expect(alice.locator("#log-lines")).to_contain_text("[rank1]")
    # The job ends: the next poll appends its last lines and the panel stops following.
    Allocation.objects.filter(job=setup.job, attempt=1).update(ended_at=timezone.now())
    Job.objects.filter(pk=setup.job.pk).update(state=JobState.SUCCEEDED)
    expect(alice.locator("#log-lines")).to_contain_text("exit code 0")
    expect(alice.locator("#log-poll")).not_to_contain_text("following")
