"""Wait reasons and event messages name only the jobs the viewer may see (issue 17, point 12):
a team's waiting job said "preempting job(s) 1" with another team's job id."""

from __future__ import annotations

from typing import Any

import pytest
from django.test import Client

from scheduler.jobs.reasons import redact
from scheduler.models import Job
from tests import factories as f
from tests.conftest import Org

CASES = [
    (
        "all-visible",
        "preempting job(s) 3, 4; starts later",
        {3, 4},
        "preempting job(s) 3, 4; starts later",
    ),
    (
        "one-hidden",
        "preempting job(s) 9; starts later",
        set(),
        "preempting a job of another team; starts later",
    ),
    ("two-hidden", "preempting job(s) 8, 9; x", set(), "preempting 2 jobs of other teams; x"),
    ("mixed", "preempting job(s) 3, 9; x", {3}, "preempting job 3 and a job of another team; x"),
    (
        "reservation",
        "waiting for reservation of job 7, expected in 3 min",
        set(),
        "waiting for reservation of a job of another team, expected in 3 min",
    ),
    (
        "elastic",
        "preempted: elastic replicas of 12 give way to job 7",
        {12},
        "preempted: elastic replicas of 12 give way to a job of another team",
    ),
    (
        "no-id",
        "quota: team-a uses 8/8 H100; job needs 8",
        set(),
        "quota: team-a uses 8/8 H100; job needs 8",
    ),
]


@pytest.mark.parametrize(
    ("text", "visible", "expected"), [c[1:] for c in CASES], ids=[c[0] for c in CASES]
)
def test_redact(text: str, visible: set[int], expected: str) -> None:
    assert redact(text, visible) == expected


@pytest.fixture
def reclaim(org: Org) -> tuple[Job, Job, Job]:
    """alice's job waits on preempting bravo's job and one of alpha's own; bravo's job was
    preempted for alice's (as the daemon writes them)."""
    own = f.JobFactory(project=org.proj_alpha, state="running")
    theirs = f.JobFactory(project=org.proj_bravo, state="preempted")
    waiting = f.JobFactory(
        project=org.proj_alpha,
        submitted_by=org.users["alice"],
        reason=f"preempting job(s) {own.pk}, {theirs.pk}; starts when they have stopped",
    )
    theirs.reason = f"preempted: best-effort job gives way to job {waiting.pk}"
    theirs.save()
    f.JobEventFactory(
        job=theirs,
        kind="preempted",
        to_state="preempted",
        message=f"Preempted: best-effort job gives way to job {waiting.pk}.",
        data={"preemptor": waiting.pk, "work_lost_gpu_s": 10},
    )
    return waiting, own, theirs


def test_api_reason_hides_another_teams_job_id(
    org: Org, reclaim: tuple[Job, Job, Job], client_for: Any
) -> None:
    waiting, own, _ = reclaim
    alice = client_for("alice")
    expected = f"preempting job {own.pk} and a job of another team; starts when they have stopped"
    assert alice.get(f"/api/v1/jobs/{waiting.pk}/").json()["reason"] == expected
    listed = {j["id"]: j["reason"] for j in alice.get("/api/v1/jobs/").json()["results"]}
    assert listed[waiting.pk] == expected
    # a platform admin sees every job, so every id
    pat = client_for("pat").get(f"/api/v1/jobs/{waiting.pk}/").json()
    assert pat["reason"] == waiting.reason


def test_api_events_hide_the_preemptor_of_another_team(
    org: Org, reclaim: tuple[Job, Job, Job], client_for: Any
) -> None:
    waiting, _, theirs = reclaim
    events = client_for("bob-bravo").get(f"/api/v1/jobs/{theirs.pk}/events/").json()["results"]
    (event,) = [e for e in events if e["kind"] == "preempted"]
    assert event["message"] == "Preempted: best-effort job gives way to a job of another team."
    assert event["data"] == {"work_lost_gpu_s": 10}
    reason = client_for("bob-bravo").get(f"/api/v1/jobs/{theirs.pk}/").json()["reason"]
    assert str(waiting.pk) not in reason
    # dana (admin of research, over both teams) sees both
    events = client_for("dana").get(f"/api/v1/jobs/{theirs.pk}/events/").json()["results"]
    (event,) = [e for e in events if e["kind"] == "preempted"]
    assert event["data"]["preemptor"] == waiting.pk


def test_portal_shows_the_reason_without_another_teams_job_id(
    org: Org, reclaim: tuple[Job, Job, Job]
) -> None:
    waiting, own, theirs = reclaim
    alice = Client()
    alice.force_login(org.users["alice"])
    for url in (f"/jobs/{waiting.pk}/", f"/jobs/{waiting.pk}/status/"):
        page = alice.get(url).content.decode()
        assert f"preempting job {own.pk} and a job of another team" in page
        assert f"job(s) {own.pk}, {theirs.pk}" not in page
    bob = Client()
    bob.force_login(org.users["bob-bravo"])
    page = bob.get(f"/jobs/{theirs.pk}/").content.decode()
    assert "best-effort job gives way to a job of another team" in page
    assert f"gives way to job {waiting.pk}" not in page


def test_a_reclaim_names_no_team_the_reader_may_not_see(org: Org, client_for: Any) -> None:
    # The engine writes "team-alpha reclaims its guarantee from team-bravo, which borrows" on
    # the victim: bob (team-bravo) must not learn team-alpha's name; dana (over both) may.
    theirs = f.JobFactory(project=org.proj_bravo, state="preempted")
    text = "team-alpha reclaims its guarantee from team-bravo, which borrows"
    theirs.reason = f"preempted: {text}"
    theirs.save()
    f.JobEventFactory(job=theirs, kind="preempted", to_state="preempted", message=f"{text}.")
    bob = client_for("bob-bravo")
    expected = "another team reclaims its guarantee from team-bravo, which borrows"
    assert bob.get(f"/api/v1/jobs/{theirs.pk}/").json()["reason"] == f"preempted: {expected}"
    events = bob.get(f"/api/v1/jobs/{theirs.pk}/events/").json()["results"]
    assert [e["message"] for e in events if e["kind"] == "preempted"] == [f"{expected}."]
    assert client_for("dana").get(f"/api/v1/jobs/{theirs.pk}/").json()["reason"] == (
        f"preempted: {text}"
    )
    page = Client()
    page.force_login(org.users["bob-bravo"])
    html = page.get(f"/jobs/{theirs.pk}/").content.decode()
    assert expected in html and "team-alpha" not in html


def test_a_preemption_by_priority_names_no_team_the_reader_may_not_see(
    org: Org, client_for: Any
) -> None:
    # A best-effort or lower-priority job gives way to "job 12 of higher priority in
    # team-alpha": bob (team-bravo) must learn neither the job nor its team.
    mine = f.JobFactory(project=org.proj_alpha, state="running")
    theirs = f.JobFactory(project=org.proj_bravo, state="preempted")
    text = f"job {mine.pk} of higher priority in team-alpha"
    theirs.reason = f"preempted: {text}"
    theirs.save()
    f.JobEventFactory(job=theirs, kind="preempted", to_state="preempted", message=f"{text}.")
    expected = "a job of another team of higher priority in another team"
    bob = client_for("bob-bravo")
    assert bob.get(f"/api/v1/jobs/{theirs.pk}/").json()["reason"] == f"preempted: {expected}"
    events = bob.get(f"/api/v1/jobs/{theirs.pk}/events/").json()["results"]
    assert [e["message"] for e in events if e["kind"] == "preempted"] == [f"{expected}."]
    page = Client()
    page.force_login(org.users["bob-bravo"])
    html = page.get(f"/jobs/{theirs.pk}/").content.decode()
    assert "team-alpha" not in html
