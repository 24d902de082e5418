"""Words the portal's pages say (QA): the home page's subtitle as a sentence, "just now"
rather than "0 minutes ago" in the lists, and a registry refusal's example that is one."""

from __future__ import annotations

import html
import re
from datetime import timedelta
from typing import Any

import pytest
from django.urls import reverse
from django.utils import timezone

from scheduler.models import Job
from tenants.models import ApprovalRequest
from tests import factories as f
from tests.conftest import Org
from tests.portal.test_approvals_audit import submit_big_job

pytestmark = pytest.mark.django_db


def _text(page: str) -> str:
    """The page's words: tags dropped, entities read, runs of spaces (nbsp too) one space."""
    return re.sub(r"\s+", " ", html.unescape(re.sub(r"<[^>]+>", " ", page)))


@pytest.mark.parametrize(
    ("persona", "subtitle"),
    [
        ("alice", "Your jobs and your teams' GPU quota."),
        (
            "tina",
            "Your jobs and your teams' GPU quota · requests waiting for you · the tenants "
            "you administer.",
        ),
        ("pat", "Requests waiting for you · the tenants you administer."),
        ("carol", "GPU quota and use across the organisation."),
    ],
)
def test_the_home_subtitle_is_a_sentence(
    org: Org, web_for: Any, persona: str, subtitle: str
) -> None:
    page = web_for(persona).get(reverse("portal:home")).content.decode()
    assert f'<p class="muted" id="home-subtitle">{html.escape(subtitle)}</p>' in page


@pytest.mark.parametrize(
    ("age", "said"),
    [
        (timedelta(seconds=20), "just now"),
        (timedelta(seconds=90), "1 minute ago"),
        (timedelta(minutes=5, seconds=10), "5 minutes ago"),
    ],
    ids=["under-a-minute", "one-minute", "minutes"],
)
def test_lists_say_how_long_ago_in_words(org: Org, web_for: Any, age: timedelta, said: str) -> None:
    job = submit_big_job(org, web_for)
    f.JobFactory(project=org.proj_alpha, submitted_by=org.users["alice"])
    Job.objects.update(created_at=timezone.now() - age)
    ApprovalRequest.objects.filter(subject_id=job.pk).update(created_at=timezone.now() - age)
    jobs = _text(web_for("alice").get(reverse("portal:jobs")).content.decode())
    inbox = _text(web_for("tina").get(reverse("portal:approvals")).content.decode())
    for name, text in [("jobs", jobs), ("inbox", inbox)]:
        assert f" {said} " in text, name
        assert "0 minutes" not in text, name


def test_a_registry_without_a_host_is_refused_with_an_example_that_is_one(
    org: Org, web_for: Any
) -> None:
    page = reverse("portal:tenant-registries", args=[org.alpha.pk])
    response = web_for("dana").post(page, {"entries": "not a host!!"})
    text = _text(response.content.decode())
    assert response.status_code == 400
    assert "does not start with a registry host (e.g. docker.io/pytorch or" in text
    assert "docker.io/not a host" not in text
