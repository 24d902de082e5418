"""The emails of approval decisions name what was asked for and link to it (issue 17, point
12): they said "job request #3" (the approval request's id) and had no link."""

from __future__ import annotations

from typing import Any

from django.core import mail

from scheduler.jobs.services import job_submit
from tenants.approvals import approval_decide, quota_request_create
from tenants.models import ApprovalPolicy, ApprovalRequest
from tenants.notifications import approval_notification_send
from tenants.quotas.rules import QuotaValues
from tests.conftest import Org, job_spec


def test_job_decision_email_names_the_job_and_links_to_its_page(org: Org, settings: Any) -> None:
    settings.GANTRY_BASE_URL = "https://gantry.example.com/"
    ApprovalPolicy.objects.create(tenant=org.alpha, rule="gpus_over", threshold=4)
    org.users["alice"].email = "alice@example.com"
    org.users["alice"].save()
    job, _ = job_submit(
        user=org.users["alice"], project=org.proj_alpha, payload=job_spec(name="bert-big")
    )
    request = ApprovalRequest.objects.get(kind="job", subject_id=job.pk)
    approval_decide(user=org.users["tina"], request=request, approve=True, comment="")
    assert approval_notification_send(request.pk) is True
    (message,) = mail.outbox
    assert message.subject == f"[Gantry] job bert-big (#{job.pk}): approved"
    assert f"Your job bert-big (#{job.pk}) in 'team-alpha' was approved." in message.body
    assert f"job request #{request.pk}" not in message.body
    assert f"See it at https://gantry.example.com/jobs/{job.pk}/" in message.body


def test_quota_decision_email_names_the_model_and_links_to_the_history(
    org: Org, settings: Any
) -> None:
    settings.GANTRY_BASE_URL = "https://gantry.example.com"
    org.users["tina"].email = "tina@example.com"
    org.users["tina"].save()
    request = quota_request_create(
        user=org.users["tina"],
        tenant=org.alpha,
        flavor=org.h100,
        values=QuotaValues(16_000, 24_000, None, 1.0),
        justification="more",
    )
    approval_decide(user=org.users["dana"], request=request, approve=False, comment="no")
    assert approval_notification_send(request.pk) is True
    (message,) = mail.outbox
    assert message.subject == "[Gantry] quota request for H100-80GB: rejected"
    assert "See it at https://gantry.example.com/approvals/history/" in message.body
