"""The job form asks "GPUs per replica" only when no GPU share or MIG slice is given instead,
and a Quote keeps every field as typed (issue 35)."""

from __future__ import annotations

from typing import Any

import pytest
from django.urls import reverse

from scheduler.models import Job
from tests.conftest import Org
from tests.portal.test_jobs import field_errors, form_body

pytestmark = pytest.mark.django_db

SHARE = {"gpus": "", "gpu_milli": 500, "gpu_memory_mib": 20000, "replicas": 1}


def test_a_gpu_share_with_gpus_left_blank_submits(org: Org, web_for: Any) -> None:
    body = form_body(org, name="notebook-share", **SHARE)
    response = web_for("alice").post(reverse("portal:job-new"), body)
    assert response.status_code == 302, field_errors(response.content.decode(), "gpus")
    job = Job.objects.get(name="notebook-share")
    assert job.gpus_per_replica == 0 and job.gpu_milli_per_replica == 500
    assert job.gpu_memory_mib == 20000


def test_a_mig_slice_with_gpus_left_blank_needs_no_gpus(org: Org, web_for: Any) -> None:
    body = form_body(org, gpus="", mig_profile="1g.10gb", replicas=1)
    html = web_for("alice").post(reverse("portal:job-new"), body).content.decode()
    # Whatever the flavors offer, the GPUs field is not what is wrong.
    assert field_errors(html, "gpus") == ""


def test_gpus_left_blank_without_a_share_says_what_to_give(org: Org, web_for: Any) -> None:
    body = form_body(org, gpus="")
    response = web_for("alice").post(reverse("portal:job-new"), body)
    assert response.status_code == 400
    errors = field_errors(response.content.decode(), "gpus")
    assert "give the GPUs per replica (0 for none), or a GPU share or MIG profile." in errors
    assert not Job.objects.exists()


@pytest.mark.parametrize("htmx", [False, True], ids=["plain-post", "htmx"])
def test_a_quote_of_a_share_keeps_every_field(org: Org, web_for: Any, htmx: bool) -> None:
    headers = {"HTTP_HX_REQUEST": "true"} if htmx else {}
    body = form_body(org, name="notebook-share", action="quote", max_runtime_hours=2, **SHARE)
    response = web_for("alice").post(reverse("portal:job-new"), body, **headers)
    html = response.content.decode()
    assert response.status_code == 200 and 'id="quote"' in html
    assert 'id="form-errors"' not in html
    for name, value in [
        ("name", "notebook-share"),
        ("command", "python train.py --epochs 3"),
        ("gpu_milli", "500"),
        ("gpu_memory_mib", "20000"),
        ("max_runtime_hours", "2"),
    ]:
        assert f'name="{name}" value="{value}"' in html, name
    assert 'name="gpus" min="0"' in html and 'name="gpus" value' not in html  # still blank
    assert "SEED=1\nMODE=fast</textarea>" in html
    assert not Job.objects.exists()
