"""Portal list pages run a bounded number of queries however many rows they show."""

from __future__ import annotations

from typing import Any

import pytest
from django.urls import reverse

from scheduler.models import JobState
from tests import factories as f
from tests.conftest import Org


@pytest.mark.parametrize(
    ("route", "persona", "limit"),
    [
        ("portal:jobs", "alice", 16),
        ("portal:job-rows", "alice", 14),
        ("portal:home", "alice", 20),
        ("portal:home", "dana", 24),
        ("portal:home", "pat", 11),
        ("portal:tenants", "pat", 16),
        ("portal:audit", "pat", 16),
        ("portal:approval-history", "pat", 14),
    ],
)
def test_list_pages_do_not_query_per_row(
    org: Org, web_for: Any, django_assert_max_num_queries: Any, route: str, persona: str, limit: int
) -> None:
    for number in range(30):
        f.JobFactory(
            project=org.proj_alpha,
            submitted_by=org.users["alice"],
            name=f"many-{number}",
            state=JobState.RUNNING,
            flavors=["H100-80GB"],
        )
    client = web_for(persona)
    client.get(reverse(route))  # warm per-request caches such as the session
    with django_assert_max_num_queries(limit):
        response = client.get(reverse(route))
    assert response.status_code == 200
