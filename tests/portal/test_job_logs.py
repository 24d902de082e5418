"""The job page's pods and logs panel: pods of every attempt with their shares, the last lines
of a replica, polls that append what came after the cursor, and scoping."""

from __future__ import annotations

import re
from typing import Any

from django.urls import reverse
from django.utils import timezone

from scheduler.models import Allocation, Job, JobState
from tests import factories as f
from tests.conftest import Org
from tests.pod_builders import requeued_job


def _text(html: str) -> str:
    return re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", html))


def test_job_page_loads_the_panel_after_the_page(org: Org, web_for: Any) -> None:
    setup = requeued_job(org, timezone.now())
    html = web_for("alice").get(reverse("portal:job-detail", args=[setup.job.pk])).content
    url = reverse("portal:job-logs", args=[setup.job.pk])
    assert f'hx-get="{url}" hx-trigger="load"' in html.decode()


def test_panel_shows_pods_of_both_attempts_and_the_log(org: Org, web_for: Any) -> None:
    setup = requeued_job(org, timezone.now())
    html = web_for("alice").get(reverse("portal:job-logs", args=[setup.job.pk])).content.decode()
    text = _text(html)
    assert "node-a" in text and "node-b" in text
    assert "GPU 1 H100-80GB (0.5 GPU, 40960 MiB)" in text
    assert "attempt ended" in text
    assert f"gantry-{setup.job.pk}-a1-r0 on node-b, attempt 1" in text
    assert "loss" in text
    # Follows from the cursor every few seconds; the replica picker offers both replicas.
    assert re.search(r'since=\d+" hx-trigger="every 3s"', html)
    assert '<option value="1">' in html


def test_a_poll_appends_new_lines_and_polls_on(org: Org, web_for: Any) -> None:
    setup = requeued_job(org, timezone.now())
    url = reverse("portal:job-logs", args=[setup.job.pk])
    html = web_for("alice").get(url, {"replica": 1, "since": "0"}).content.decode()
    assert 'hx-swap-oob="beforeend:#log-lines"' in html
    assert "Loading dataset shards" in html  # from line 0 on
    assert 'id="log-poll" hx-get=' in html and "replica=1&amp;since=" in html


def test_polling_stops_when_the_job_is_final(org: Org, web_for: Any) -> None:
    setup = requeued_job(org, timezone.now())
    Allocation.objects.filter(job=setup.job, attempt=1).update(ended_at=timezone.now())
    Job.objects.filter(pk=setup.job.pk).update(state=JobState.SUCCEEDED)
    html = web_for("alice").get(reverse("portal:job-logs", args=[setup.job.pk])).content.decode()
    assert "exit code 0" in html
    assert 'id="log-poll">' in html and "every 3s" not in html


def test_a_queued_job_says_it_has_not_started(org: Org, web_for: Any) -> None:
    job = f.JobFactory(project=org.proj_alpha, submitted_by=org.users["alice"])
    html = web_for("alice").get(reverse("portal:job-logs", args=[job.pk])).content.decode()
    text = _text(html)
    assert "No pods yet" in text and "has not started yet (queued)" in text
    assert "every 3s" in html  # it may start: keep asking


def test_another_teams_job_panel_is_not_found(org: Org, web_for: Any) -> None:
    setup = requeued_job(org, timezone.now())
    response = web_for("bob-bravo").get(reverse("portal:job-logs", args=[setup.job.pk]))
    assert response.status_code == 404


def test_finance_sees_the_job_its_pods_and_cost_but_not_its_logs(org: Org, web_for: Any) -> None:
    """Logs may hold secrets the job printed and are not cost data (scheduler/jobs/selectors.py)."""
    setup = requeued_job(org, timezone.now())
    carol = web_for("carol")
    assert carol.get(reverse("portal:job-logs", args=[setup.job.pk])).status_code == 404
    html = carol.get(reverse("portal:job-detail", args=[setup.job.pk])).content.decode()
    assert 'id="job-cost"' in html and 'id="job-pods"' in html and "node-b" in html
    assert reverse("portal:job-logs", args=[setup.job.pk]) not in html
    assert "Logs are for the job's team and platform admins" in html
    assert web_for("pat").get(reverse("portal:job-logs", args=[setup.job.pk])).status_code == 200


def test_bad_replica_or_cursor_is_400(org: Org, web_for: Any) -> None:
    setup = requeued_job(org, timezone.now())
    url = reverse("portal:job-logs", args=[setup.job.pk])
    client = web_for("alice")
    assert client.get(url, {"replica": 5}).status_code == 400
    assert client.get(url, {"replica": "x"}).status_code == 400
    response = client.get(url, {"since": "nope"})
    assert response.status_code == 400 and b"since" in response.content


def test_panel_query_count_does_not_grow_with_pods(
    org: Org, web_for: Any, django_assert_max_num_queries: Any
) -> None:
    setup = requeued_job(org, timezone.now())
    client = web_for("alice")
    url = reverse("portal:job-logs", args=[setup.job.pk])
    client.get(url)  # session and user loaded once
    with django_assert_max_num_queries(12) as few:
        assert client.get(url).status_code == 200
    node = f.NodeFactory()
    for attempt in range(2, 10):
        f.AllocationFactory(job=setup.job, node=node, attempt=attempt, ended_at=timezone.now())
    with django_assert_max_num_queries(len(few.captured_queries)):
        assert client.get(url).status_code == 200


def test_a_cluster_that_cannot_be_asked_is_said_in_the_panel(
    org: Org, web_for: Any, settings: Any, monkeypatch: Any, tmp_path: Any
) -> None:
    from scheduler.backends import factory

    setup = requeued_job(org, timezone.now())
    settings.GANTRY_CLUSTER_BACKEND = "kubernetes"
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "missing-kubeconfig"))
    factory._log_source.cache_clear()
    try:
        response = web_for("alice").get(reverse("portal:job-logs", args=[setup.job.pk]))
    finally:
        factory._log_source.cache_clear()
    assert response.status_code == 200  # HTMX swaps 2xx answers only
    text = _text(response.content.decode())
    assert "The cluster could not be asked for the log" in text
    assert "node-b" in text and "every 3s" in response.content.decode()  # and it tries again
