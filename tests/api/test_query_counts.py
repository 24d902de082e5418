"""List endpoints cost a bounded number of queries, whatever the number of rows."""

from __future__ import annotations

from typing import Any

import pytest

from tenants.models import Membership, PriorityDefault
from tests import factories as f
from tests.conftest import Org

LIST_ROUTES = [
    "/api/v1/tenants/",
    "/api/v1/projects/",
    "/api/v1/memberships/",
    "/api/v1/flavors/",
    "/api/v1/quotas/",
    "/api/v1/priority-classes/",
    "/api/v1/priority-defaults/",
    "/api/v1/jobs/",
    "/api/v1/me/",
]


def grow(org: Org, n: int, start: int = 0) -> None:
    """Add n rows of every listed kind inside team-alpha."""
    for i in range(start, start + n):
        project = f.ProjectFactory(tenant=org.alpha, slug=f"bulk-{i}")
        user = f.UserFactory(username=f"bulk-user-{i}")
        Membership.objects.create(user=user, tenant=org.alpha, role="member")
        job = f.JobFactory(project=project, submitted_by=user)
        f.JobEventFactory(job=job)
        team = f.TenantFactory(slug=f"bulk-team-{i}", parent=org.alpha)
        PriorityDefault.objects.create(
            tenant=team, job_type="batch", priority_class=f.priority("low")
        )


@pytest.mark.parametrize("url", LIST_ROUTES)
def test_list_queries_do_not_grow_with_rows(
    org: Org, client_for: Any, url: str, django_assert_max_num_queries: Any
) -> None:
    grow(org, 3)
    client = client_for("tina")
    client.get(url)  # warm-up: content types, etc.
    with django_assert_max_num_queries(6) as few:
        assert client.get(url).status_code == 200
    grow(org, 25, start=3)
    client = client_for("tina")
    with django_assert_max_num_queries(len(few.captured_queries)):
        response = client.get(url + ("?page_size=200" if url != "/api/v1/me/" else ""))
        assert response.status_code == 200


def test_job_events_list_is_bounded(
    org: Org, client_for: Any, django_assert_max_num_queries: Any
) -> None:
    job = f.JobFactory(project=org.proj_alpha, submitted_by=org.users["alice"])
    for _ in range(40):
        f.JobEventFactory(job=job, actor=org.users["alice"])
    client = client_for("alice")
    with django_assert_max_num_queries(6):
        response = client.get(f"/api/v1/jobs/{job.pk}/events/?page_size=100")
    assert response.json()["count"] == 40


@pytest.mark.parametrize("query", ["state=running&state=queued", "job_type=batch"])
def test_job_list_filters_by_state_or_type_without_distinct(
    org: Org, client_for: Any, query: str
) -> None:
    """A filter on the job's own columns cannot repeat a row: the list must not ask for
    DISTINCT, which sorts every matching job on all its columns before taking a page."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    grow(org, 3)
    client = client_for("tina")
    with CaptureQueriesContext(connection) as queries:
        assert client.get(f"/api/v1/jobs/?{query}").status_code == 200
    jobs = [q["sql"] for q in queries.captured_queries if '"scheduler_job"' in q["sql"]]
    assert jobs
    assert not [sql for sql in jobs if "DISTINCT" in sql.upper()], jobs
