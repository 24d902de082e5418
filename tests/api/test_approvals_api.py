"""The governance API: approval policies, requests and the inbox, quota requests, the audit log
and its CSV export (docs/faults.md 25, 26, 28)."""

from __future__ import annotations

import csv
import io
from datetime import timedelta
from typing import Any

import pytest
from django.utils import timezone

from scheduler.models import Job, JobState
from tenants import approvals
from tenants.models import ApprovalPolicy, ApprovalRequest, AuditEntry, Quota
from tests import factories as f
from tests.conftest import Org, job_spec

JOBS = "/api/v1/jobs/"
POLICIES = "/api/v1/approval-policies/"
REQUESTS = "/api/v1/approval-requests/"
INBOX = "/api/v1/approval-requests/inbox/"
QUOTA_REQUESTS = "/api/v1/quota-requests/"
AUDIT = "/api/v1/audit/"
EXPORT = "/api/v1/audit/export.csv"


@pytest.fixture(autouse=True)
def no_broker(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(approvals, "enqueue_notification", lambda request_id: None)


@pytest.fixture
def charlie_lead(org: Org) -> Any:
    """An approver of another team."""
    lead = f.UserFactory(username="charlie-lead")
    f.MembershipFactory(user=lead, tenant=org.charlie, role="approver")
    org.users["charlie-lead"] = lead
    return lead


def submit_big_job(org: Org, client_for: Any, username: str = "alice") -> dict[str, Any]:
    ApprovalPolicy.objects.get_or_create(tenant=org.alpha, rule="gpus_over", threshold=4)
    response = client_for(username).post(
        JOBS, {"project": org.proj_alpha.pk, "spec": job_spec()}, format="json"
    )
    assert response.status_code == 201, response.json()
    return response.json()


def request_id(job: dict[str, Any]) -> int:
    return ApprovalRequest.objects.get(kind="job", subject_id=job["id"]).pk


# --- the journey ------------------------------------------------------------------------------


def test_member_submits_approver_approves_from_the_inbox_member_sees_it_queued(
    org: Org, client_for: Any
) -> None:
    job = submit_big_job(org, client_for)
    assert job["state"] == "pending_approval"
    inbox = client_for("dana").get(INBOX).json()["results"]
    assert [r["subject_id"] for r in inbox] == [job["id"]]
    assert inbox[0]["reasons"] == ["asks for 8 GPUs (policy of 'team-alpha': GPUs over 4)"]
    assert inbox[0]["requester"] == "alice"
    response = client_for("dana").post(
        f"{REQUESTS}{inbox[0]['id']}/approve/", {"comment": "go"}, format="json"
    )
    assert response.status_code == 200, response.json()
    assert (response.json()["state"], response.json()["decided_by"]) == ("approved", "dana")
    assert client_for("alice").get(f"{JOBS}{job['id']}/").json()["state"] == "queued"
    assert client_for("dana").get(INBOX).json()["results"] == []


def test_reject_with_a_comment(org: Org, client_for: Any) -> None:
    job = submit_big_job(org, client_for)
    response = client_for("tina").post(
        f"{REQUESTS}{request_id(job)}/reject/", {"comment": "use 4 GPUs"}, format="json"
    )
    assert response.status_code == 200
    detail = client_for("alice").get(f"{JOBS}{job['id']}/").json()
    assert (detail["state"], detail["reason"]) == ("rejected", "rejected by tina: use 4 GPUs")


def test_self_approval_is_refused(org: Org, client_for: Any) -> None:
    job = submit_big_job(org, client_for, "tina")
    response = client_for("tina").post(f"{REQUESTS}{request_id(job)}/approve/", {}, format="json")
    assert response.status_code == 403
    assert "own request" in response.json()["detail"]
    assert Job.objects.get(pk=job["id"]).state == JobState.PENDING_APPROVAL


def test_a_member_cannot_approve(org: Org, client_for: Any) -> None:
    job = submit_big_job(org, client_for, "tina")
    response = client_for("alice").post(f"{REQUESTS}{request_id(job)}/approve/", {}, format="json")
    assert response.status_code == 403
    assert client_for("alice").get(INBOX).json()["results"] == []


def test_approvers_of_other_tenants_get_404(org: Org, client_for: Any, charlie_lead: Any) -> None:
    job = submit_big_job(org, client_for)
    pk = request_id(job)
    client = client_for("charlie-lead")
    assert client.get(f"{REQUESTS}{pk}/").status_code == 404
    for verb in ["approve", "reject"]:
        assert client.post(f"{REQUESTS}{pk}/{verb}/", {}, format="json").status_code == 404
    assert client.get(INBOX).json()["results"] == []
    assert client.get(REQUESTS).json()["results"] == []
    assert ApprovalRequest.objects.get(pk=pk).state == "pending"


def test_a_second_decision_is_409(org: Org, client_for: Any) -> None:
    pk = request_id(submit_big_job(org, client_for))
    assert client_for("tina").post(f"{REQUESTS}{pk}/approve/", {}, format="json").status_code == 200
    response = client_for("dana").post(f"{REQUESTS}{pk}/reject/", {}, format="json")
    assert response.status_code == 409
    assert "already approved by tina" in response.json()["detail"]


@pytest.mark.parametrize(
    "body",
    [{"comment": "x" * 1001}, {"comment": "ok", "state": "approved"}, {"decided_by": 1}],
    ids=["long-comment", "extra-state", "decided-by"],
)
def test_decision_body_is_strict(org: Org, client_for: Any, body: dict[str, Any]) -> None:
    pk = request_id(submit_big_job(org, client_for))
    response = client_for("tina").post(f"{REQUESTS}{pk}/approve/", body, format="json")
    assert response.status_code == 400
    assert ApprovalRequest.objects.get(pk=pk).state == "pending"


def test_a_member_cannot_smuggle_an_approval_into_a_job_spec(org: Org, client_for: Any) -> None:
    ApprovalPolicy.objects.create(tenant=org.alpha, rule="gpus_over", threshold=4)
    spec = job_spec(approved_by="alice", state="queued")
    response = client_for("alice").post(
        JOBS, {"project": org.proj_alpha.pk, "spec": spec}, format="json"
    )
    assert response.status_code == 400
    assert not Job.objects.exists()


# --- policies -----------------------------------------------------------------------------------


def test_admin_creates_changes_and_deletes_a_policy(org: Org, client_for: Any) -> None:
    client = client_for("tina")
    created = client.post(
        POLICIES,
        {"tenant": org.alpha.pk, "rule": "priority_at_least", "priority_class": "high"},
        format="json",
    )
    assert created.status_code == 201, created.json()
    body = created.json()
    assert (body["summary"], body["applies_to_jobs"]) == ("priority at or above high", True)
    changed = client.patch(f"{POLICIES}{body['id']}/", {"active": False}, format="json")
    assert changed.status_code == 200 and changed.json()["active"] is False
    assert client.delete(f"{POLICIES}{body['id']}/").status_code == 204
    assert not ApprovalPolicy.objects.exists()
    actions = list(AuditEntry.objects.order_by("id").values_list("action", flat=True))
    assert actions == ["policy.set", "policy.set", "policy.delete"]


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"rule": "gpus_over"}, "threshold"),
        ({"rule": "gpus_over", "threshold": -1}, "threshold"),
        ({"rule": "priority_at_least"}, "priority_class"),
        ({"rule": "borrowing", "threshold": 3}, "threshold"),
        ({"rule": "gpus_over", "threshold": 1, "applies_to_jobs": False}, "applies_to_jobs"),
        ({"rule": "nonsense"}, "rule"),
        ({"rule": "borrowing", "tenant_id": 1}, "tenant_id"),
    ],
)
def test_bad_policies_are_400_naming_the_field(
    org: Org, client_for: Any, body: dict[str, Any], field: str
) -> None:
    response = client_for("tina").post(POLICIES, {"tenant": org.alpha.pk, **body}, format="json")
    assert response.status_code == 400
    assert field in response.json()["errors"]
    assert not ApprovalPolicy.objects.exists()


def test_a_member_sees_policies_but_cannot_write_them(org: Org, client_for: Any) -> None:
    policy = ApprovalPolicy.objects.create(tenant=org.alpha, rule="borrowing")
    client = client_for("alice")
    assert [p["id"] for p in client.get(POLICIES).json()["results"]] == [policy.pk]
    assert (
        client.post(
            POLICIES, {"tenant": org.alpha.pk, "rule": "borrowing"}, format="json"
        ).status_code
        == 403
    )
    assert (
        client.patch(f"{POLICIES}{policy.pk}/", {"active": False}, format="json").status_code == 403
    )
    assert client.delete(f"{POLICIES}{policy.pk}/").status_code == 403
    policy.refresh_from_db()
    assert policy.active


# --- quota requests -------------------------------------------------------------------------------


def test_team_admin_requests_quota_and_the_department_admin_approves(
    org: Org, client_for: Any
) -> None:
    body = {
        "tenant": org.alpha.pk,
        "flavor": org.h100.pk,
        "guaranteed_milli": 16000,
        "limit_milli": 24000,
        "justification": "new model",
    }
    assert client_for("alice").post(QUOTA_REQUESTS, body, format="json").status_code == 403
    response = client_for("tina").post(QUOTA_REQUESTS, body, format="json")
    assert response.status_code == 201, response.json()
    created = response.json()
    assert (created["kind"], created["state"]) == ("quota", "pending")
    assert created["payload"]["justification"] == "new model"
    assert client_for("tina").post(f"{REQUESTS}{created['id']}/approve/").status_code == 403
    inbox = client_for("dana").get(INBOX).json()["results"]
    assert [r["id"] for r in inbox] == [created["id"]]
    assert client_for("dana").post(f"{REQUESTS}{created['id']}/approve/").status_code == 200
    assert Quota.objects.get(tenant=org.alpha, flavor=org.h100).limit_milli == 24000


def test_a_quota_request_that_cannot_fit_is_400(org: Org, client_for: Any) -> None:
    body = {
        "tenant": org.alpha.pk,
        "flavor": org.h100.pk,
        "guaranteed_milli": 20000,
        "limit_milli": 32000,
    }  # alpha 20 + bravo 16 > research 32
    response = client_for("tina").post(QUOTA_REQUESTS, body, format="json")
    assert response.status_code == 400
    assert "guaranteed_milli" in response.json()["errors"]
    assert not ApprovalRequest.objects.exists()


# --- the audit log ----------------------------------------------------------------------


def make_history(org: Org, client_for: Any) -> None:
    client_for("tina").post(POLICIES, {"tenant": org.alpha.pk, "rule": "borrowing"}, format="json")
    quota = Quota.objects.get(tenant=org.bravo, flavor=org.h100)
    client_for("dana").patch(
        f"/api/v1/quotas/{quota.pk}/", {"guaranteed_milli": 12000}, format="json"
    )
    quota = Quota.objects.get(tenant=org.charlie, flavor=org.h100)
    client_for("pat").patch(
        f"/api/v1/quotas/{quota.pk}/", {"guaranteed_milli": 8000}, format="json"
    )


def test_admin_changes_a_quota_and_the_audit_log_shows_it(org: Org, client_for: Any) -> None:
    make_history(org, client_for)
    rows = client_for("dana").get(AUDIT, {"action": "quota.set"}).json()["results"]
    assert len(rows) == 1
    row = rows[0]
    assert (row["actor"], row["tenant_slug"]) == ("dana", "team-bravo")
    assert (row["before"]["guaranteed_milli"], row["after"]["guaranteed_milli"]) == (16000, 12000)


@pytest.mark.parametrize(
    ("params", "actions"),
    [
        ({}, ["quota.set", "policy.set"]),
        ({"actor": "tina"}, ["policy.set"]),
        ({"action": "quota.set"}, ["quota.set"]),
        ({"tenant": "alpha"}, ["policy.set"]),
        ({"tenant": "research"}, ["quota.set", "policy.set"]),  # the subtree
        ({"tenant": "charlie"}, []),  # not dana's: nothing, not an error
        ({"at_after": "future"}, []),
        ({"at_before": "future"}, ["quota.set", "policy.set"]),
    ],
)
def test_audit_filters(
    org: Org, client_for: Any, params: dict[str, str], actions: list[str]
) -> None:
    make_history(org, client_for)
    query = dict(params)
    if "tenant" in query:
        query["tenant"] = str(getattr(org, query["tenant"]).pk)
    for key in ("at_after", "at_before"):
        if key in query:
            query[key] = (timezone.now() + timedelta(hours=1)).isoformat()
    response = client_for("dana").get(AUDIT, query)
    assert response.status_code == 200, response.json()
    assert [r["action"] for r in response.json()["results"]] == actions


@pytest.mark.parametrize("method", ["post", "put", "patch", "delete"])
def test_the_audit_log_has_no_write_route(org: Org, client_for: Any, method: str) -> None:
    make_history(org, client_for)
    entry = AuditEntry.objects.first()
    assert entry is not None
    client = client_for("pat")
    assert getattr(client, method)(AUDIT, {}, format="json").status_code == 405
    assert getattr(client, method)(f"{AUDIT}{entry.pk}/", {}, format="json").status_code == 405
    assert getattr(client, method)(EXPORT, {}, format="json").status_code == 405
    assert AuditEntry.objects.count() == 3


def read_csv(response: Any) -> list[list[str]]:
    assert response["Content-Type"].startswith("text/csv")
    return list(csv.reader(io.StringIO(response.content.decode())))


def test_csv_export_neutralises_formulas(org: Org, client_for: Any) -> None:
    # A username Django's validators would refuse, as an imported directory might give.
    evil = f.UserFactory(username="=cmd|' /C calc'!A0")
    f.MembershipFactory(user=evil, tenant=org.alpha, role="admin")
    org.users[evil.username] = evil
    client_for(evil.username).post(
        POLICIES,
        {"tenant": org.alpha.pk, "rule": "borrowing", "description": "plain"},
        format="json",
    )
    rows = read_csv(client_for("tina").get(EXPORT))
    assert rows[0] == [
        "at",
        "actor",
        "action",
        "tenant",
        "target_type",
        "target_id",
        "before",
        "after",
    ]
    assert [r[1] for r in rows[1:]] == ["'=cmd|' /C calc'!A0"]
    assert not any(cell.startswith(("=", "+", "-", "@")) for row in rows for cell in row)


def test_csv_export_is_scoped_and_filtered(org: Org, client_for: Any) -> None:
    make_history(org, client_for)
    assert [r[3] for r in read_csv(client_for("dana").get(EXPORT))[1:]] == [
        "team-alpha",
        "team-bravo",
    ]
    assert [r[3] for r in read_csv(client_for("tina").get(EXPORT))[1:]] == ["team-alpha"]
    assert read_csv(client_for("alice").get(EXPORT))[1:] == []
    assert len(read_csv(client_for("carol").get(EXPORT))[1:]) == 3
    only = read_csv(client_for("carol").get(EXPORT, {"action": "quota.set"}))[1:]
    assert [r[2] for r in only] == ["quota.set", "quota.set"]
    assert client_for("carol").get(EXPORT, {"at_after": "yesterday"}).status_code == 400


def test_csv_export_answers_accept_text_csv(org: Org, client_for: Any) -> None:
    response = client_for("pat").get(EXPORT, HTTP_ACCEPT="text/csv")
    assert response.status_code == 200
    assert read_csv(response)[0][0] == "at"


# --- bounded queries --------------------------------------------------------------------


@pytest.mark.parametrize("url", [REQUESTS, INBOX, AUDIT, POLICIES, EXPORT])
def test_governance_lists_do_not_grow_with_rows(
    org: Org, client_for: Any, url: str, django_assert_max_num_queries: Any
) -> None:
    def grow(n: int) -> None:
        for _ in range(n):
            job = f.JobFactory(project=org.proj_alpha, submitted_by=org.users["alice"])
            ApprovalRequest.objects.create(
                kind="job",
                tenant=org.alpha,
                requester=org.users["alice"],
                subject_id=job.pk,
                expires_at=timezone.now() + timedelta(days=1),
                decided_by=None,
            )
            ApprovalPolicy.objects.create(tenant=org.alpha, rule="gpus_over", threshold=1)
            AuditEntry.objects.create(
                at=timezone.now(),
                actor=org.users["alice"],
                actor_name="alice",
                action="job.submit",
                tenant=org.alpha,
                target_type="scheduler.job",
                target_id=str(job.pk),
            )

    grow(2)
    client = client_for("dana")
    client.get(url)
    with django_assert_max_num_queries(8) as few:
        assert client.get(url).status_code == 200
    grow(20)
    with django_assert_max_num_queries(len(few.captured_queries)):
        assert client.get(url).status_code == 200
