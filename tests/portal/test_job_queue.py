"""A waiting job's page: position, the jobs ahead, reason, and the start as times and
"in about X", as the scheduler last stored them."""

from __future__ import annotations

import re
from datetime import timedelta
from typing import Any

import pytest
from django.urls import reverse
from django.utils import timezone

from portal.views.jobs import in_about
from scheduler.models import JobQueueEstimate
from tests.conftest import Org
from tests.eta_builders import small_queue


def _text(html: str) -> str:
    return re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", html))


@pytest.mark.parametrize("view", ["portal:job-detail", "portal:job-status"])
def test_member_sees_where_their_job_stands(org: Org, web_for: Any, view: str) -> None:
    queue = small_queue(org, timezone.now())
    html = web_for("alice").get(reverse(view, args=[queue.second.pk])).content.decode()
    text = _text(html)
    assert "2 in its team's queue, 3 in the cluster" in text
    assert "in about 40 minutes" in text
    p50 = JobQueueEstimate.objects.get(job=queue.second).eta_p50
    assert p50 is not None and p50.strftime("%Y-%m-%d %H:%M") in text
    # alpha's job ahead is linked; bravo's is only counted, and its id is not in the reason
    assert reverse("portal:job-detail", args=[queue.first.pk]) in html
    assert "1 of other teams" in text
    assert reverse("portal:job-detail", args=[queue.bravo.pk]) not in html
    assert f"job {queue.bravo.pk}" not in text and "bravo" not in text


def test_a_running_job_shows_no_position(org: Org, web_for: Any) -> None:
    queue = small_queue(org, timezone.now())
    queue.second.state = "running"
    queue.second.save(update_fields=["state"])
    html = web_for("alice").get(reverse("portal:job-detail", args=[queue.second.pk])).content
    assert b'id="job-queue"' not in html


def test_a_job_not_estimated_yet_says_so(org: Org, web_for: Any) -> None:
    queue = small_queue(org, timezone.now())
    JobQueueEstimate.objects.filter(job=queue.second).update(
        eta_p50=None, eta_p90=None, estimated_at=None
    )
    html = web_for("alice").get(reverse("portal:job-detail", args=[queue.second.pk])).content
    assert "not estimated yet" in _text(html.decode())


@pytest.mark.parametrize("view", ["portal:job-detail", "portal:job-status"])
def test_the_expected_start_says_when_it_was_estimated(org: Org, web_for: Any, view: str) -> None:
    # The time in brackets is when the estimate was made: read as "estimated 11:21" it
    # looked like a start time.
    now = timezone.now()
    queue = small_queue(org, now)
    made = now - timedelta(minutes=7)
    JobQueueEstimate.objects.filter(job=queue.second).update(
        eta_p50=None, eta_p90=None, estimated_at=made
    )
    text = _text(web_for("alice").get(reverse(view, args=[queue.second.pk])).content.decode())
    assert f"not within the next week (as of {made:%H:%M} UTC)" in text
    assert "(estimated" not in text


@pytest.mark.parametrize(
    ("seconds", "text"),
    [
        (30, "any moment now"),
        (-300, "any moment now"),
        (timedelta(minutes=40).total_seconds(), "in about 40 minutes"),
        (timedelta(hours=5, minutes=20).total_seconds(), "in about 5 hours"),
        (timedelta(days=3).total_seconds(), "in about 3 days"),
    ],
)
def test_in_about(seconds: float, text: str) -> None:
    assert in_about(seconds) == text


def test_a_requeued_job_says_when_it_gets_a_position(org: Org, web_for: Any) -> None:
    # requeued after the daemon's last refresh: no stored position yet, but its page says
    # it waits and when it is placed, rather than nothing
    now = timezone.now()
    queue = small_queue(org, now - timedelta(seconds=10))
    JobQueueEstimate.objects.filter(job=queue.second).delete()
    queue.second.queued_at = now
    queue.second.save(update_fields=["queued_at"])
    html = web_for("alice").get(reverse("portal:job-status", args=[queue.second.pk])).content
    assert "next pass (every 30 s)" in _text(html.decode())
