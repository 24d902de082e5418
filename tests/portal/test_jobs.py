"""Job pages: submission with inline errors and per-type defaults, list filters and paging,
the polled partials, cancel, and CSRF on the forms."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest
from django.test import Client
from django.urls import reverse

from scheduler.jobs.spec import MAX_RUNTIME_S
from scheduler.models import Job, JobState
from tenants.models import PriorityDefault
from tests import factories as f
from tests.conftest import Org


def form_body(org: Org, **overrides: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "project": org.proj_alpha.pk,
        "job_type": "training",
        "name": "bert-pretrain",
        "image": "registry.example.com/nlp/bert:1.2",
        "command": "python train.py --epochs 3",
        "env": "SEED=1\nMODE=fast",
        "replicas": 2,
        "gpus": 4,
        "cpu_milli": 8000,
        "memory_mib": 65536,
        "flavors": ["H100-80GB"],
        "retry_limit": 1,
        "idempotency_key": "form-1",
    }
    body.update(overrides)
    return body


def field_errors(html: str, field: str) -> str:
    """The inline errors rendered inside one field's block ('' when there are none)."""
    match = re.search(
        rf'<div class="field has-error[^"]*" id="field-{field}".*?</div>\s*</div>', html, re.S
    )
    return match.group(0) if match else ""


def test_submit_queues_a_job_and_shows_it(org: Org, web_for: Any) -> None:
    client = web_for("alice")
    response = client.post(reverse("portal:job-new"), form_body(org))
    job = Job.objects.get(name="bert-pretrain")
    assert response.status_code == 302 and response.url == reverse(
        "portal:job-detail", args=[job.pk]
    )
    assert job.state == JobState.QUEUED and job.submitted_by == org.users["alice"]
    assert job.spec["command"] == ["python", "train.py", "--epochs", "3"]
    assert job.spec["env"] == {"SEED": "1", "MODE": "fast"}
    assert job.replicas == 2 and job.gpu_milli_per_replica == 4000 and job.flavors == ["H100-80GB"]
    page = client.get(response.url).content.decode()
    assert "bert-pretrain" in page and "submitted and queued" in page


def test_double_submit_of_one_form_makes_one_job(org: Org, web_for: Any) -> None:
    client = web_for("alice")
    client.post(reverse("portal:job-new"), form_body(org))
    second = client.post(reverse("portal:job-new"), form_body(org), follow=True)
    assert Job.objects.filter(name="bert-pretrain").count() == 1
    assert "already submitted" in second.content.decode()


# The spec's message comes from job_submit, or from spec_errors beside the form's own.
@pytest.mark.parametrize(
    "overrides", [{}, {"env": "NOEQUALS"}], ids=["submitted", "with-a-form-error"]
)
def test_max_runtime_over_the_bound_is_told_in_hours(
    org: Org, web_for: Any, overrides: dict[str, Any]
) -> None:
    # 1000 h is past the spec's bound of 30 days = 30 * 24 = 720 h (2592000 s).
    body = form_body(org, max_runtime_hours="1000", **overrides)
    html = web_for("alice").post(reverse("portal:job-new"), body).content.decode()
    errors = field_errors(html, "max_runtime_hours")
    assert f"must be at most {MAX_RUNTIME_S // 3600} hours." in errors
    assert str(MAX_RUNTIME_S) not in html
    assert not Job.objects.exists()


@pytest.mark.parametrize(
    ("overrides", "field", "message"),
    [
        ({"name": "Bad_Name"}, "name", "is not a valid job name"),
        ({"image": "not an image!"}, "image", "is not a container image reference"),
        ({"gpus": 0, "gpu_milli": 500}, "gpu_memory_mib", "needs the GPU memory"),
        (
            {"job_type": "inference", "min_replicas": 3, "max_replicas": 2},
            "max_replicas",
            "is below min_replicas",
        ),
        ({"mig_profile": "9g.99gb", "gpus": 0}, "", "unknown MIG profile"),
        ({"command": "python 'unclosed"}, "command", "cannot split the command"),
        ({"env": "NOEQUALS"}, "env", "write KEY=value"),
        ({"env": "RANK=3"}, "env", "RANK is "),
        # was accepted, keeping A=2
        ({"env": "A=1\nB=x\n A=2"}, "env", "line 3: A is already set on line 1"),
        ({"replicas": 0}, "replicas", "greater than or equal to 1"),
    ],
    ids=[
        "name",
        "image",
        "share-needs-memory",
        "inference-range",
        "mig",
        "command-quotes",
        "env-syntax",
        "env-reserved",
        "env-duplicate",
        "replicas",
    ],
)
def test_bad_fields_show_inline_errors_and_submit_nothing(
    org: Org, web_for: Any, overrides: dict[str, Any], field: str, message: str
) -> None:
    response = web_for("alice").post(reverse("portal:job-new"), form_body(org, **overrides))
    html = response.content.decode()
    assert response.status_code == 400
    assert message in html
    if field:
        assert message in field_errors(html, field), f"{message!r} not inline on {field}"
    assert 'id="form-errors"' in html
    assert not Job.objects.exists()
    # what the user typed is kept
    assert 'value="registry.example.com/nlp/bert:1.2"' in html or "image" in overrides


@pytest.mark.parametrize(
    ("job_type", "expected"),
    [
        ("inference", {"replicas": "2", "min_replicas": "1", "max_replicas": "4", "gpus": "1"}),
        ("interactive", {"max_runtime_hours": "8", "replicas": "1"}),
        ("batch", {"replicas": "4", "retry_limit": "2", "max_runtime_hours": "24"}),
        ("training", {"gpus": "8"}),
    ],
)
def test_defaults_follow_the_job_type(
    org: Org, web_for: Any, job_type: str, expected: dict[str, str]
) -> None:
    html = web_for("alice").get(reverse("portal:job-new"), {"type": job_type}).content.decode()
    assert re.search(rf'<option value="{job_type}" selected>', html)
    for name, value in expected.items():
        assert re.search(rf'name="{name}" value="{value}"', html), (name, value)
    # the client-side defaults and the team's priority default per type travel with the page
    assert 'id="type-defaults"' in html and '"inference": "high"' in html


def test_inference_defaults_reach_the_job(org: Org, web_for: Any) -> None:
    body = form_body(
        org, job_type="inference", name="chat", replicas=2, min_replicas=1, max_replicas=4, gpus=1
    )
    web_for("alice").post(reverse("portal:job-new"), body)
    job = Job.objects.get(name="chat")
    assert job.priority_class.name == "high"  # the platform default for inference
    assert (job.spec["min_replicas"], job.spec["max_replicas"]) == (1, 4)


def test_interactive_gets_eight_hours_when_left_blank(org: Org, web_for: Any) -> None:
    web_for("alice").post(
        reverse("portal:job-new"),
        form_body(org, job_type="interactive", name="notebook", replicas=1),
    )
    assert Job.objects.get(name="notebook").max_runtime_s == 8 * 3600


def test_finance_cannot_open_the_submit_form(org: Org, web_for: Any) -> None:
    assert web_for("carol").get(reverse("portal:job-new")).status_code == 403


# --- list, partials, detail -------------------------------------------------------------


def test_list_filters_by_state_type_and_project(org: Org, web_for: Any) -> None:
    alice = org.users["alice"]
    f.JobFactory(project=org.proj_alpha, submitted_by=alice, name="run-a", state=JobState.RUNNING)
    f.JobFactory(project=org.proj_alpha, submitted_by=alice, name="wait-b", job_type="batch")
    client = web_for("alice")
    url = reverse("portal:jobs")
    running = client.get(url, {"state": "running"}).content.decode()
    assert "run-a" in running and "wait-b" not in running
    batch = client.get(url, {"type": "batch"}).content.decode()
    assert "wait-b" in batch and "run-a" not in batch
    by_project = client.get(url, {"project": org.proj_alpha.pk}).content.decode()
    assert "run-a" in by_project and "wait-b" in by_project


def test_list_pages_and_the_polled_rows_keep_filters(org: Org, web_for: Any) -> None:
    for number in range(30):
        f.JobFactory(
            project=org.proj_alpha, submitted_by=org.users["alice"], name=f"job-n{number:02d}"
        )
    client = web_for("alice")
    first = client.get(reverse("portal:jobs")).content.decode()
    assert "Page 1 of 2" in first and "job-n29" in first and "job-n00" not in first
    assert 'hx-trigger="every 5s"' in first
    rows = client.get(reverse("portal:job-rows"), {"page": 2}, HTTP_HX_REQUEST="true")
    html = rows.content.decode()
    assert "<html" not in html and "job-n00" in html and "Page 2 of 2" in html


def test_detail_shows_spec_events_and_polls_until_final(org: Org, web_for: Any) -> None:
    job = f.JobFactory(
        project=org.proj_alpha,
        submitted_by=org.users["alice"],
        name="detail-me",
        state=JobState.QUEUED,
        reason="quota: team-alpha uses 16/16 H100",
    )
    f.JobEventFactory(job=job, message="Submitted by alice.")
    client = web_for("alice")
    html = client.get(reverse("portal:job-detail", args=[job.pk])).content.decode()
    assert "quota: team-alpha uses 16/16 H100" in html and "Submitted by alice." in html
    assert "pytorch/pytorch:2.4" in html and "Cancel job" in html
    status = client.get(reverse("portal:job-status", args=[job.pk])).content.decode()
    assert "hx-trigger" in status and "<html" not in status
    Job.objects.filter(pk=job.pk).update(state=JobState.SUCCEEDED)
    final = client.get(reverse("portal:job-status", args=[job.pk])).content.decode()
    assert "hx-trigger" not in final and "Succeeded" in final


# --- cancel -------------------------------------------------------------------------------


def test_submitter_cancels_with_a_reason(org: Org, web_for: Any) -> None:
    job = f.JobFactory(project=org.proj_alpha, submitted_by=org.users["alice"])
    response = web_for("alice").post(
        reverse("portal:job-cancel", args=[job.pk]), {"reason": "wrong data"}, follow=True
    )
    job.refresh_from_db()
    assert job.state == JobState.CANCELLED
    assert "wrong data" in job.events.last().message
    assert "cancelled" in response.content.decode()


def test_team_admin_may_cancel_a_members_job(org: Org, web_for: Any) -> None:
    job = f.JobFactory(project=org.proj_alpha, submitted_by=org.users["alice"])
    web_for("tina").post(reverse("portal:job-cancel", args=[job.pk]))
    job.refresh_from_db()
    assert job.state == JobState.CANCELLED


def test_another_member_sees_the_job_but_cannot_cancel_it(org: Org, web_for: Any) -> None:
    other = f.UserFactory(username="alex")
    f.MembershipFactory(user=other, tenant=org.alpha, role="member")
    job = f.JobFactory(project=org.proj_alpha, submitted_by=org.users["alice"])
    client = Client()
    client.force_login(other)
    page = client.get(reverse("portal:job-detail", args=[job.pk])).content.decode()
    assert "Cancel job" not in page
    assert client.post(reverse("portal:job-cancel", args=[job.pk])).status_code == 403
    job.refresh_from_db()
    assert job.state == JobState.QUEUED


def test_cancelling_a_finished_job_says_why(org: Org, web_for: Any) -> None:
    job = f.JobFactory(
        project=org.proj_alpha, submitted_by=org.users["alice"], state=JobState.SUCCEEDED
    )
    response = web_for("alice").post(reverse("portal:job-cancel", args=[job.pk]), follow=True)
    assert "cannot be cancelled" in response.content.decode()


# --- CSRF -------------------------------------------------------------------------------


def test_forms_refuse_posts_without_the_csrf_token(org: Org) -> None:
    job = f.JobFactory(project=org.proj_alpha, submitted_by=org.users["alice"])
    client = Client(enforce_csrf_checks=True)
    client.force_login(org.users["alice"])
    assert client.post(reverse("portal:job-cancel", args=[job.pk])).status_code == 403
    assert client.post(reverse("portal:job-new"), form_body(org)).status_code == 403
    job.refresh_from_db()
    assert job.state == JobState.QUEUED and Job.objects.count() == 1
    # the page's token (a form field, or the header HTMX sends) is accepted
    page = client.get(reverse("portal:job-detail", args=[job.pk])).content.decode()
    token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', page).group(1)
    assert f'"X-CSRFToken": "{token}"' in page
    response = client.post(reverse("portal:job-cancel", args=[job.pk]), HTTP_X_CSRFTOKEN=token)
    assert response.status_code == 302
    job.refresh_from_db()
    assert job.state == JobState.CANCELLED


def test_priority_hint_follows_the_nearest_default(org: Org, web_for: Any) -> None:
    PriorityDefault.objects.create(
        tenant=org.research, job_type="batch", priority_class=f.priority("normal")
    )
    PriorityDefault.objects.create(
        tenant=org.alpha, job_type="batch", priority_class=f.priority("high")
    )
    PriorityDefault.objects.create(
        tenant=org.research, job_type="evaluation", priority_class=f.priority("normal")
    )
    pat = web_for("pat")
    html = pat.get(reverse("portal:job-new")).content.decode()
    hints = json.loads(re.search(r'id="priority-defaults"[^>]*>(.*?)</script>', html).group(1))
    alpha, bravo = hints[str(org.proj_alpha.pk)], hints[str(org.proj_bravo.pk)]
    assert (alpha["batch"], alpha["evaluation"], alpha["inference"]) == ("high", "normal", "high")
    assert (bravo["batch"], bravo["evaluation"]) == ("normal", "normal")
    assert hints[str(org.proj_charlie.pk)]["batch"] == "low"  # the platform's


def test_submit_form_reports_every_error_in_one_round(org: Org, web_for: Any) -> None:
    # The name, replicas and GPU-memory errors (the spec's) showed only once the command,
    # env and GPU errors (the form's own) were fixed: two rounds.
    body = form_body(
        org,
        name="Bad_Name",
        command="python 'unclosed",
        env="NOEQUALS",
        gpus=-1,
        replicas=10**9,
        gpu_milli=500,
    )
    response = web_for("alice").post(reverse("portal:job-new"), body)
    assert response.status_code == 400
    html = response.content.decode()
    expected = {
        "command": "cannot split the command",
        "env": "write KEY=value",
        "gpus": "greater than or equal to 0",
        "name": "is not a valid job name",
        "replicas": "less than or equal to 1024",
        "gpu_memory_mib": "needs the GPU memory",
    }
    for field, message in expected.items():
        assert message in field_errors(html, field), f"{message!r} not inline on {field}"
    assert not Job.objects.exists()
