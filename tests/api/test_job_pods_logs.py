"""`/api/v1/jobs/{id}/pods/` and `/api/v1/jobs/{id}/logs/`: where a job runs and ran, and
its pods' logs (the simulated cluster's here), scoped like the job."""

from __future__ import annotations

from typing import Any

import pytest
from django.utils import timezone

from scheduler.backends.simulated.logs import sim_log
from scheduler.jobs.pods import log_target
from scheduler.models import Allocation, AllocationDevice, GpuDevice, Job, JobState
from tenants.access import forget_grants
from tenants.models import Membership, Role
from tests import factories as f
from tests.conftest import Org
from tests.pod_builders import requeued_job


def test_pods_show_both_attempts_with_nodes_and_shares(org: Org, client_for: Any) -> None:
    now = timezone.now()
    setup = requeued_job(org, now)
    response = client_for("alice").get(f"/api/v1/jobs/{setup.job.pk}/pods/")
    assert response.status_code == 200
    pods = response.json()["results"]
    assert [(p["attempt"], p["replica"], p["node"], p["active"]) for p in pods] == [
        (1, 0, "node-b", True),
        (1, 1, "node-b", True),
        (0, 0, "node-a", False),
        (0, 1, "node-a", False),
    ]
    assert [d["index"] for p in pods[:2] for d in p["devices"]] == [0, 1]
    assert pods[0]["devices"] == [
        {"index": 0, "model": "H100-80GB", "share_milli": 500, "memory_mib": 40960}
    ]
    assert pods[0]["pod"] == f"gantry-{setup.job.pk}-a1-r0"
    assert pods[2]["end_reason"] == "attempt ended" and pods[2]["ended_at"] is not None
    assert pods[0]["ended_at"] is None and pods[0]["bound_at"] is not None


def test_pods_query_count_does_not_grow_with_pods(
    org: Org, client_for: Any, django_assert_max_num_queries: Any
) -> None:
    setup = requeued_job(org, timezone.now())
    client = client_for("alice")
    url = f"/api/v1/jobs/{setup.job.pk}/pods/"
    with django_assert_max_num_queries(6) as few:
        assert client.get(url).status_code == 200
    node = f.NodeFactory()
    device = GpuDevice.objects.create(node=node, index=0, model="H100-80GB", memory_mib=81920)
    for attempt in range(2, 12):  # ten more attempts, each with its device
        allocation = f.AllocationFactory(
            job=setup.job, node=node, attempt=attempt, ended_at=timezone.now()
        )
        AllocationDevice.objects.create(
            allocation=allocation, device=device, milli=500, released=True
        )
    with django_assert_max_num_queries(len(few.captured_queries)):
        assert len(client.get(url).json()["results"]) == 14


@pytest.mark.parametrize("route", ["pods", "logs"])
def test_another_teams_job_is_not_found(org: Org, client_for: Any, route: str) -> None:
    setup = requeued_job(org, timezone.now())
    response = client_for("bob-bravo").get(f"/api/v1/jobs/{setup.job.pk}/{route}/")
    assert response.status_code == 404
    assert "node-a" not in response.content.decode()


def test_logs_of_a_running_replica_are_the_simulated_clusters(org: Org, client_for: Any) -> None:
    now = timezone.now()
    setup = requeued_job(org, now)
    response = client_for("alice").get(f"/api/v1/jobs/{setup.job.pk}/logs/?replica=1&tail=5")
    assert response.status_code == 200
    body = response.json()
    assert (body["pod"], body["attempt"], body["node"]) == (
        f"gantry-{setup.job.pk}-a1-r1",
        1,
        "node-b",
    )
    expected = sim_log(log_target(setup.job, setup.second[1]), now=timezone.now(), tail=5)
    assert [line["text"] for line in body["lines"]] == [line.text for line in expected.lines]
    assert len(body["lines"]) == 5 and body["done"] is False and body["message"] == ""
    assert any("loss" in line["text"] for line in body["lines"])


def test_logs_continue_from_the_cursor(org: Org, client_for: Any) -> None:
    setup = requeued_job(org, timezone.now())
    client = client_for("alice")
    url = f"/api/v1/jobs/{setup.job.pk}/logs/"
    first = client.get(url, {"tail": 3}).json()
    again = client.get(url, {"since": first["cursor"]}).json()
    # A line every 30 s: nothing new within the test, and nothing repeated.
    assert again["lines"] == [] and again["cursor"] == first["cursor"]


def test_logs_of_an_earlier_attempt_end_as_it_ended(org: Org, client_for: Any) -> None:
    setup = requeued_job(org, timezone.now())
    body = client_for("alice").get(f"/api/v1/jobs/{setup.job.pk}/logs/?attempt=0&tail=2").json()
    assert body["attempt"] == 0 and body["node"] == "node-a" and body["done"] is True
    assert body["lines"][-1]["text"] == "Checkpoint saved; exiting"


def test_a_failed_job_ends_its_log_with_a_traceback(org: Org, client_for: Any) -> None:
    setup = requeued_job(org, timezone.now())
    Allocation.objects.filter(job=setup.job, attempt=1).update(ended_at=timezone.now())
    Job.objects.filter(pk=setup.job.pk).update(state=JobState.FAILED, reason="OOMKilled")
    body = client_for("alice").get(f"/api/v1/jobs/{setup.job.pk}/logs/?tail=3").json()
    assert any("CUDA out of memory" in line["text"] for line in body["lines"])
    assert body["done"] is True


def test_a_queued_job_answers_no_lines_and_says_why(org: Org, client_for: Any) -> None:
    job = f.JobFactory(project=org.proj_alpha, submitted_by=org.users["alice"])
    response = client_for("alice").get(f"/api/v1/jobs/{job.pk}/logs/")
    assert response.status_code == 200
    body = response.json()
    assert body["lines"] == [] and body["pod"] is None and body["done"] is False
    assert "has not started yet (queued)" in body["message"]


@pytest.mark.parametrize(
    ("query", "field"),
    [
        ("replica=2", "replica"),  # the job has replicas 0 and 1
        ("replica=-1", "replica"),
        ("replica=x", "replica"),
        ("tail=0", "tail"),
        ("tail=1001", "tail"),
        ("tail=ten", "tail"),
        ("attempt=2", "attempt"),  # the job is at attempt 1
        ("since=not-a-cursor", "since"),
        ("follow=1", "follow"),
    ],
)
def test_bad_query_values_are_400_with_the_field(
    org: Org, client_for: Any, query: str, field: str
) -> None:
    setup = requeued_job(org, timezone.now())
    response = client_for("alice").get(f"/api/v1/jobs/{setup.job.pk}/logs/?{query}")
    assert response.status_code == 400, response.content
    assert field in response.json()["errors"]


def test_a_cluster_that_cannot_be_reached_is_a_503_with_why(
    org: Org, client_for: Any, settings: Any, monkeypatch: pytest.MonkeyPatch, tmp_path: Any
) -> None:
    """The web process reads logs through the backend of GANTRY_CLUSTER_BACKEND; Kubernetes
    credentials that cannot be loaded are the cluster not answering, not a 500."""
    from scheduler.backends import factory

    setup = requeued_job(org, timezone.now())
    settings.GANTRY_CLUSTER_BACKEND = "kubernetes"
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "missing-kubeconfig"))
    factory._log_source.cache_clear()
    try:
        response = client_for("alice").get(f"/api/v1/jobs/{setup.job.pk}/logs/")
    finally:
        factory._log_source.cache_clear()
    assert response.status_code == 503
    assert "credentials could not be loaded" in response.json()["detail"]


def test_an_earlier_attempt_without_a_pod_is_done(org: Org, client_for: Any) -> None:
    """Attempt 0 failed to bind (no pod left); attempt 1 runs: following attempt 0 stops."""
    job = f.JobFactory(
        project=org.proj_alpha, submitted_by=org.users["alice"], attempt=1, state=JobState.RUNNING
    )
    f.AllocationFactory(job=job, attempt=1)
    body = client_for("alice").get(f"/api/v1/jobs/{job.pk}/logs/?attempt=0").json()
    assert body["pod"] is None and body["done"] is True
    assert "attempt 0" in body["message"]


def test_finance_without_a_role_on_the_team_reads_the_job_but_not_its_logs(
    org: Org, client_for: Any
) -> None:
    """Logs may hold secrets the job printed and are not cost data: finance, who sees every
    job and its cost, gets a 404 for the logs of a team it holds no role on."""
    setup = requeued_job(org, timezone.now())
    carol, url = client_for("carol"), f"/api/v1/jobs/{setup.job.pk}"
    assert carol.get(f"{url}/logs/").status_code == 404
    assert carol.get(f"{url}/").status_code == 200
    assert carol.get(f"{url}/pods/").status_code == 200
    assert client_for("pat").get(f"{url}/logs/").status_code == 200
    # A role on the team (or above it) opens them, finance or not.
    Membership.objects.create(user=org.users["carol"], tenant=org.research, role=Role.MEMBER)
    forget_grants(org.users["carol"])
    assert client_for("carol").get(f"{url}/logs/").status_code == 200
