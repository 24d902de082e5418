"""`/api/v1/queue/` (your waiting jobs, for `gantry queue`) and `/api/v1/usage/` (your
tenants against their quotas, for `gantry usage`), issue 20's CLI."""

from __future__ import annotations

from typing import Any

from django.utils import timezone

from scheduler.models import JobState
from tests import factories as f
from tests.conftest import Org
from tests.eta_builders import small_queue


def test_queue_lists_my_waiting_jobs_in_the_schedulers_order(org: Org, client_for: Any) -> None:
    queue = small_queue(org, timezone.now())
    approval = f.JobFactory(project=org.proj_alpha, submitted_by=org.users["alice"],
                            state=JobState.PENDING_APPROVAL)  # fmt: skip
    f.JobFactory(project=org.proj_alpha, submitted_by=org.users["alice"], state=JobState.RUNNING)
    f.JobFactory(project=org.proj_alpha, submitted_by=org.users["tina"])  # a teammate's
    body = client_for("alice").get("/api/v1/queue/").json()
    rows = body["results"]
    assert [r["id"] for r in rows] == [queue.first.pk, queue.second.pk, approval.pk]
    second = rows[1]
    assert (second["position_tenant"], second["position_cluster"]) == (2, 3)
    assert second["eta_p50"] and second["eta_p90"] and second["estimated_at"]
    # the reason names another team's job: redacted as on the job's own queue answer
    assert str(queue.bravo.pk) not in second["reason"] and "reservation" in second["reason"]
    assert rows[2]["state"] == "pending_approval" and rows[2]["position_cluster"] is None


def test_queue_queries_do_not_grow_with_jobs(
    org: Org, client_for: Any, django_assert_max_num_queries: Any
) -> None:
    for _ in range(30):
        f.JobFactory(project=org.proj_alpha, submitted_by=org.users["alice"])
    client = client_for("alice")
    client.get("/api/v1/queue/")
    with django_assert_max_num_queries(8):
        body = client.get("/api/v1/queue/").json()
    assert body["count"] == 30


def test_usage_shows_my_teams_in_use_guarantee_and_limit(org: Org, client_for: Any) -> None:
    job = f.JobFactory(project=org.proj_alpha, state=JobState.RUNNING, replicas=3)
    f.place(job)  # three replicas of one H100 each
    rows = client_for("alice").get("/api/v1/usage/").json()
    assert rows == [
        {
            "tenant": org.alpha.pk,
            "tenant_slug": "team-alpha",
            "flavor_name": "H100-80GB",
            "used_milli": 3000,
            "guaranteed_milli": 16000,
            "limit_milli": 32000,
            "borrowing": False,
            "quota": True,
        }
    ]
    # an admin of research sees the department's subtree use, not the teams by name
    dana = client_for("dana").get("/api/v1/usage/").json()
    assert [(r["tenant_slug"], r["used_milli"]) for r in dana] == [("research", 3000)]


def test_usage_of_another_tenant_is_404_and_bad_input_400(org: Org, client_for: Any) -> None:
    alice = client_for("alice")
    assert alice.get("/api/v1/usage/", {"tenant": org.bravo.pk}).status_code == 404
    bad = alice.get("/api/v1/usage/", {"tenant": "abc"})
    assert bad.status_code == 400 and "tenant" in bad.json()["errors"]
    research = client_for("dana").get("/api/v1/usage/", {"tenant": org.alpha.pk}).json()
    assert [r["tenant_slug"] for r in research] == ["team-alpha"]
