"""Approval inbox and history, deciding in place through HTMX, and the audit log pages."""

from __future__ import annotations

import csv
import io
from typing import Any

import pytest
from django.urls import reverse
from django.utils import timezone

from scheduler.models import Job, JobState
from tenants import approval_policies
from tenants.models import ApprovalRequest, AuditEntry, Quota
from tests.conftest import Org
from tests.portal.test_jobs import form_body


def submit_big_job(org: Org, web_for: Any, user: str = "alice") -> Job:
    """A policy on team-alpha sends jobs over 4 GPUs to approvers; submit an 8-GPU job."""
    if not org.alpha.approval_policies.exists():
        approval_policies.policy_set(
            user=org.users["tina"], tenant=org.alpha, rule="gpus_over", threshold=4
        )
    web_for(user).post(
        reverse("portal:job-new"), form_body(org, name=f"big-{user}", idempotency_key=f"k-{user}")
    )
    return Job.objects.get(name=f"big-{user}")


def test_submission_that_needs_approval_waits_and_says_why(org: Org, web_for: Any) -> None:
    job = submit_big_job(org, web_for)
    assert job.state == JobState.PENDING_APPROVAL
    html = web_for("alice").get(reverse("portal:job-detail", args=[job.pk])).content.decode()
    assert "Pending Approval" in html and "GPUs" in html


def test_approver_inbox_lists_the_request_and_home_shows_it(org: Org, web_for: Any) -> None:
    job = submit_big_job(org, web_for)
    inbox = web_for("tina").get(reverse("portal:approvals")).content.decode()
    assert job.name in inbox and "Approve" in inbox
    home = web_for("tina").get(reverse("portal:home")).content.decode()
    assert 'id="home-inbox"' in home and job.name in home
    # the requester's team member sees no decision buttons
    assert job.name not in web_for("alice").get(reverse("portal:approvals")).content.decode()


def test_approving_through_htmx_swaps_the_row_and_queues_the_job(org: Org, web_for: Any) -> None:
    job = submit_big_job(org, web_for)
    request = ApprovalRequest.objects.get(subject_id=job.pk, kind="job")
    response = web_for("tina").post(
        reverse("portal:approval-decide", args=[request.pk]),
        {"decision": "approve", "comment": "go ahead"},
        HTTP_HX_REQUEST="true",
    )
    html = response.content.decode()
    assert response.status_code == 200 and "<html" not in html
    assert f'id="approval-{request.pk}"' in html and "approved" in html and "go ahead" in html
    job.refresh_from_db()
    assert job.state == JobState.QUEUED


def test_rejecting_without_htmx_redirects_and_history_shows_the_comment(
    org: Org, web_for: Any
) -> None:
    job = submit_big_job(org, web_for)
    request = ApprovalRequest.objects.get(subject_id=job.pk, kind="job")
    response = web_for("tina").post(
        reverse("portal:approval-decide", args=[request.pk]),
        {"decision": "reject", "comment": "too big"},
    )
    assert response.status_code == 302
    job.refresh_from_db()
    assert job.state == JobState.REJECTED
    history = web_for("alice").get(reverse("portal:approval-history")).content.decode()
    assert "too big" in history and "rejected" in history


def test_nobody_approves_their_own_request(org: Org, web_for: Any) -> None:
    job = submit_big_job(org, web_for, user="tina")
    request = ApprovalRequest.objects.get(subject_id=job.pk, kind="job")
    assert job.name not in web_for("tina").get(reverse("portal:approvals")).content.decode()
    response = web_for("tina").post(
        reverse("portal:approval-decide", args=[request.pk]), {"decision": "approve"}
    )
    assert response.status_code == 403
    job.refresh_from_db()
    assert job.state == JobState.PENDING_APPROVAL


def test_a_member_cannot_decide(org: Org, web_for: Any) -> None:
    job = submit_big_job(org, web_for, user="tina")
    request = ApprovalRequest.objects.get(subject_id=job.pk, kind="job")
    response = web_for("alice").post(
        reverse("portal:approval-decide", args=[request.pk]), {"decision": "approve"}
    )
    assert response.status_code == 403


def test_second_decision_is_reported_not_applied(org: Org, web_for: Any) -> None:
    job = submit_big_job(org, web_for)
    request = ApprovalRequest.objects.get(subject_id=job.pk, kind="job")
    web_for("tina").post(
        reverse("portal:approval-decide", args=[request.pk]), {"decision": "approve"}
    )
    late = web_for("dana").post(
        reverse("portal:approval-decide", args=[request.pk]),
        {"decision": "reject"},
        HTTP_HX_REQUEST="true",
    )
    assert "already" in late.content.decode() or "approved" in late.content.decode()
    request.refresh_from_db()
    assert request.state == "approved" and request.decided_by == org.users["tina"]


# --- audit log -------------------------------------------------------------------------


def test_admin_reads_and_filters_their_subtree_audit_log(org: Org, web_for: Any) -> None:
    submit_big_job(org, web_for)
    client = web_for("tina")
    html = client.get(reverse("portal:audit")).content.decode()
    assert "job.submit" in html and "policy.set" in html
    only_policy = client.get(reverse("portal:audit"), {"action": "policy"}).content.decode()
    assert "policy.set" in only_policy and "job.submit" not in only_policy
    by_actor = client.get(reverse("portal:audit"), {"actor": "alice"}).content.decode()
    assert "job.submit" in by_actor and "policy.set" not in by_actor
    future = timezone.now().date().replace(year=timezone.now().year + 1).isoformat()
    assert "No entries." in client.get(reverse("portal:audit"), {"since": future}).content.decode()


def test_members_cannot_read_the_audit_log(org: Org, web_for: Any) -> None:
    assert web_for("alice").get(reverse("portal:audit")).status_code == 403
    assert web_for("alice").get(reverse("portal:audit-export")).status_code == 403


def test_csv_export_follows_the_filters_and_defuses_formulas(org: Org, web_for: Any) -> None:
    submit_big_job(org, web_for)
    AuditEntry.objects.create(
        at=timezone.now(),
        actor_name='=HYPERLINK("x")',
        action="job.note",
        tenant=org.alpha,
        target_type="scheduler.job",
        target_id="1",
        before=None,
        after={"note": "x"},
    )
    response = web_for("tina").get(reverse("portal:audit-export"), {"tenant": org.alpha.pk})
    assert response["Content-Type"].startswith("text/csv")
    assert "attachment" in response["Content-Disposition"]
    rows = list(csv.reader(io.StringIO(b"".join(response.streaming_content).decode())))
    assert rows[0][:3] == ["at", "actor", "action"]
    actions = {row[2] for row in rows[1:]}
    assert {"job.submit", "policy.set", "job.note"} <= actions
    assert [row[1] for row in rows[1:] if row[2] == "job.note"] == ['\'=HYPERLINK("x")']
    assert all(row[3] == "team-alpha" for row in rows[1:])


def test_quota_request_is_decided_in_the_inbox_of_an_admin_above(org: Org, web_for: Any) -> None:
    web_for("tina").post(
        reverse("portal:tenant-quotas", args=[org.alpha.pk]),
        {
            "flavor": "H100-80GB",
            "guaranteed": "16",
            "limit": "40",
            "weight": "1",
            "justification": "a bigger sweep",
        },
    )
    request = ApprovalRequest.objects.get(kind="quota", tenant=org.alpha)
    assert (
        "Quota H100-80GB" not in web_for("tina").get(reverse("portal:approvals")).content.decode()
    )
    inbox = web_for("dana").get(reverse("portal:approvals")).content.decode()
    assert "Quota H100-80GB" in inbox and "a bigger sweep" in inbox
    web_for("dana").post(
        reverse("portal:approval-decide", args=[request.pk]),
        {"decision": "approve", "comment": "ok for Q3"},
    )
    assert Quota.objects.get(tenant=org.alpha, flavor=org.h100).limit_milli == 40000


def test_approver_decides_from_the_job_page_and_returns_to_it(org: Org, web_for: Any) -> None:
    job = submit_big_job(org, web_for)
    url = reverse("portal:job-detail", args=[job.pk])
    assert 'id="job-approval"' not in web_for("alice").get(url).content.decode()
    page = web_for("tina").get(url).content.decode()
    assert 'id="job-approval"' in page
    request = ApprovalRequest.objects.get(subject_id=job.pk, kind="job")
    response = web_for("tina").post(
        reverse("portal:approval-decide", args=[request.pk]), {"decision": "approve", "next": url}
    )
    assert response.status_code == 302 and response.url == url
    job.refresh_from_db()
    assert job.state == JobState.QUEUED
    evil = web_for("dana").post(
        reverse("portal:approval-decide", args=[request.pk]),
        {"decision": "approve", "next": "https://evil.example/"},
    )
    assert evil.url == reverse("portal:approvals")


def test_audit_log_names_references_instead_of_ids(org: Org, web_for: Any) -> None:
    # a job's priority class showed as `priority_class 3`
    job = submit_big_job(org, web_for)
    html = web_for("tina").get(reverse("portal:audit"), {"action": "job.submit"}).content.decode()
    assert "<code>priority_class</code> " in html
    name = job.priority_class.name
    pk = job.priority_class_id
    assert f'<span class="new">{name}</span>' in html
    assert f'<span class="new">{pk}</span>' not in html
    assert f'<span class="new">{org.proj_alpha.slug}</span>' in html


def test_audit_log_pages_are_bounded(org: Org, web_for: Any) -> None:
    AuditEntry.objects.bulk_create(
        AuditEntry(
            at=timezone.now(),
            actor_name="tina",
            action="job.note",
            tenant=org.alpha,
            target_type="scheduler.job",
            target_id=str(i),
            before=None,
            after={"note": i},
        )
        for i in range(120)
    )
    client = web_for("tina")

    def rows(**query: Any) -> int:
        html = client.get(reverse("portal:audit"), query).content.decode()
        return html.count("<code>job.note</code>")

    assert rows() == 25  # the default, as the other lists
    assert rows(page_size=100) == 100
    assert rows(page_size=1000) == 25  # beyond the bound: refused, with the default
    html = client.get(reverse("portal:audit"), {"page_size": 1000}).content.decode()
    assert "page_size" in html and "less than or equal to 100" in html


def test_home_cards_name_states_as_people_write_them(org: Org, web_for: Any) -> None:
    # the admin and finance cards said "pendingapproval"
    submit_big_job(org, web_for)
    for user in ("tina", "carol"):
        html = web_for(user).get(reverse("portal:home")).content.decode()
        assert "pendingapproval" not in html.lower()
    assert "<span>Pending approval</span>" in web_for("tina").get("/").content.decode()
    assert "<span>pending approval jobs</span>" in web_for("carol").get("/").content.decode()


def test_the_inbox_shows_the_teams_quota_now_for_the_models_asked_for(
    org: Org, web_for: Any
) -> None:
    from tests import factories as f

    job = submit_big_job(org, web_for)
    running = f.JobFactory(project=org.proj_alpha, state=JobState.RUNNING, flavors=["H100-80GB"])
    f.place(running)  # 1 GPU of H100 held by team-alpha now
    quota = Quota.objects.get(tenant=org.alpha, flavor=org.h100)
    inbox = web_for("tina").get(reverse("portal:approvals")).content.decode()
    row = inbox[inbox.index(f'id="approval-{ApprovalRequest.objects.get(subject_id=job.pk).pk}"') :]
    expected = (
        f"H100-80GB: 1 in use of {quota.guaranteed_milli / 1000:g} guaranteed, "
        f"limit {quota.limit_milli / 1000:g} GPUs"
    )
    assert expected in row.split("</tr>")[0]
    assert "A100" not in row.split("</tr>")[0]  # the job asks for H100 only
    home = web_for("tina").get(reverse("portal:home")).content.decode()
    assert expected in home


@pytest.mark.parametrize(
    ("retries", "said"),
    [(1, "up to 96.0 GPU-h over 2 attempts"), (0, "up to 48.0 GPU-h")],
    ids=["two-attempts", "one-attempt"],
)
def test_the_gpu_hours_asked_for_say_they_count_every_attempt(
    org: Org, web_for: Any, retries: int, said: str
) -> None:
    # 3 replicas x 8 GPUs x 2 h = 48 GPU-h an attempt; a retry allows a second attempt: 96.
    approval_policies.policy_set(
        user=org.users["tina"], tenant=org.alpha, rule="gpus_over", threshold=4
    )
    body = form_body(org, replicas=3, gpus=8, max_runtime_hours="2", retry_limit=retries)
    web_for("alice").post(reverse("portal:job-new"), body)
    job = Job.objects.get(name="bert-pretrain", state=JobState.PENDING_APPROVAL)
    request = ApprovalRequest.objects.get(subject_id=job.pk, kind="job")
    tina = web_for("tina")
    pages = {
        "inbox": tina.get(reverse("portal:approvals")),
        "home": tina.get(reverse("portal:home")),
        "job page": tina.get(reverse("portal:job-detail", args=[job.pk])),
        "decided row": tina.post(
            reverse("portal:approval-decide", args=[request.pk]),
            {"decision": "approve"},
            HTTP_HX_REQUEST="true",
        ),
        "history": tina.get(reverse("portal:approval-history")),
    }
    for name, response in pages.items():
        html = response.content.decode()
        assert f"{said}<" in html, name  # "<": nothing more, on one attempt
