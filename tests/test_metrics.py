"""/metrics is for operators only (docs/faults.md 31): tenant slugs, never users, projects or jobs.
The tenant series themselves: tests/metrics/."""

from __future__ import annotations

from typing import Any

from django.test import Client
from rest_framework.authtoken.models import Token

from tests import factories as f
from tests.conftest import Org


def test_anonymous_and_members_get_404(org: Org) -> None:
    assert Client().get("/metrics").status_code == 404
    client = Client()
    client.force_login(org.users["alice"])
    assert client.get("/metrics").status_code == 404
    token = Token.objects.create(user=org.users["carol"])  # finance: not an operator
    response = Client().get("/metrics", headers={"Authorization": f"Token {token.key}"})
    assert response.status_code == 404


def test_wrong_bearer_token_is_404(org: Org, settings: Any) -> None:
    settings.GANTRY_METRICS_TOKEN = "s3cret-scrape-token"
    response = Client().get("/metrics", headers={"Authorization": "Bearer guess"})
    assert response.status_code == 404


def test_scraper_reads_counts_without_user_or_project_names(org: Org, settings: Any) -> None:
    settings.GANTRY_METRICS_TOKEN = "s3cret-scrape-token"
    f.JobFactory(
        project=org.proj_alpha,
        submitted_by=org.users["alice"],
        replicas=2,
        gpu_milli_per_replica=4000,
    )
    f.JobFactory(project=org.proj_bravo, submitted_by=org.users["bob-bravo"])
    response = Client().get("/metrics", headers={"Authorization": "Bearer s3cret-scrape-token"})
    assert response.status_code == 200
    text = response.content.decode()
    assert 'gantry_jobs{state="queued"} 2.0' in text
    # 2 replicas x 4000 milli + 1 replica x 1000 milli = 9000
    assert 'gantry_jobs_gpu_milli{state="queued"} 9000.0' in text
    # Tenants appear as Kueue's cluster_queue (operators only); people and projects never.
    assert 'cluster_queue="team-alpha"' in text
    for secret in ("proj-alpha", "proj-bravo", "alice", "bob-bravo", "tenant="):
        assert secret not in text


def test_platform_admin_may_read_metrics(org: Org) -> None:
    client = Client()
    client.force_login(org.users["pat"])
    response = client.get("/metrics")
    assert response.status_code == 200
    assert "gantry_scheduler_epoch" in response.content.decode()
