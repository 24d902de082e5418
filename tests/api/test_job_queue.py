"""`/api/v1/jobs/{id}/queue/`: a waiting job's position, the jobs ahead, reason and start."""

from __future__ import annotations

import json
from datetime import timedelta
from typing import Any

import pytest
from django.utils import timezone

from scheduler.models import JobQueueEstimate, JobState
from tests.conftest import Org
from tests.eta_builders import small_queue


def test_member_sees_position_and_start(org: Org, client_for: Any) -> None:
    queue = small_queue(org, timezone.now())
    body = client_for("alice").get(f"/api/v1/jobs/{queue.second.pk}/queue/").json()
    assert body["waiting"] is True
    assert (body["position_tenant"], body["position_cluster"], body["ahead_count"]) == (2, 3, 2)
    assert body["eta_p50"] < body["eta_p90"]
    stored = JobQueueEstimate.objects.get(job=queue.second)
    assert body["eta_p50"] == stored.eta_p50.isoformat().replace("+00:00", "Z")


def test_member_sees_other_teams_jobs_ahead_only_as_counts(org: Org, client_for: Any) -> None:
    queue = small_queue(org, timezone.now())
    response = client_for("alice").get(f"/api/v1/jobs/{queue.second.pk}/queue/")
    body = response.json()
    assert [a["id"] for a in body["ahead"]] == [queue.first.pk]
    assert (body["ahead_visible"], body["ahead_hidden"]) == (1, 1)
    # bravo's job: neither its id (in the reason or the list) nor its team's slug
    assert f"job {queue.bravo.pk}" not in body["reason"]
    assert "a job of another team" in body["reason"]
    assert queue.bravo.pk not in [a["id"] for a in body["ahead"]]
    assert "bravo" not in json.dumps(body)


def test_platform_admin_sees_every_job_ahead(org: Org, client_for: Any) -> None:
    queue = small_queue(org, timezone.now())
    body = client_for("pat").get(f"/api/v1/jobs/{queue.second.pk}/queue/").json()
    assert [a["id"] for a in body["ahead"]] == [queue.bravo.pk, queue.first.pk]
    assert [a["tenant_slug"] for a in body["ahead"]] == ["team-bravo", "team-alpha"]
    assert (body["ahead_visible"], body["ahead_hidden"]) == (2, 0)
    assert f"job {queue.bravo.pk}" in body["reason"]


@pytest.mark.parametrize("state", [JobState.RUNNING, JobState.PENDING_APPROVAL])
def test_a_job_that_does_not_wait_has_no_position(org: Org, client_for: Any, state: str) -> None:
    queue = small_queue(org, timezone.now())
    queue.second.state = state
    queue.second.save(update_fields=["state"])
    body = client_for("alice").get(f"/api/v1/jobs/{queue.second.pk}/queue/").json()
    assert body["waiting"] is False
    assert body["position_cluster"] is None and body["eta_p50"] is None and body["ahead"] == []


def test_another_teams_job_queue_is_not_found(org: Org, client_for: Any) -> None:
    queue = small_queue(org, timezone.now())
    response = client_for("alice").get(f"/api/v1/jobs/{queue.bravo.pk}/queue/")
    assert response.status_code == 404


def test_a_requeued_job_waits_at_once_with_a_note_until_it_has_a_position(
    org: Org, client_for: Any
) -> None:
    # second was requeued after the daemon's last refresh (its pods stopping, or the
    # refresh not due yet): the daemon dropped its row, but it waits from the moment it is
    # queued, and says when it gets a position.
    now = timezone.now()
    queue = small_queue(org, now - timedelta(seconds=10))
    JobQueueEstimate.objects.filter(job=queue.second).delete()
    queue.second.queued_at = now
    queue.second.save(update_fields=["queued_at"])
    body = client_for("alice").get(f"/api/v1/jobs/{queue.second.pk}/queue/").json()
    assert body["waiting"] is True
    assert body["position_cluster"] is None and body["eta_p50"] is None
    assert "next pass (every 30 s)" in body["position_note"]


def test_a_queued_job_outside_the_daemons_window_says_so(org: Org, client_for: Any) -> None:
    # queued before the last refresh, yet not placed by it: beyond the daemon's window
    now = timezone.now()
    queue = small_queue(org, now)
    JobQueueEstimate.objects.filter(job=queue.second).delete()
    queue.second.queued_at = now - timedelta(minutes=5)
    queue.second.save(update_fields=["queued_at"])
    body = client_for("alice").get(f"/api/v1/jobs/{queue.second.pk}/queue/").json()
    assert body["waiting"] is True
    assert "no position until jobs ahead of it start" in body["position_note"]


def test_a_placed_job_has_no_note(org: Org, client_for: Any) -> None:
    queue = small_queue(org, timezone.now())
    body = client_for("alice").get(f"/api/v1/jobs/{queue.second.pk}/queue/").json()
    assert body["position_note"] is None
