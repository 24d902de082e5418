"""Tenant admin pages: members and roles, quotas with current use, quota requests, priority
defaults and approval policies."""

from __future__ import annotations

from typing import Any

import pytest
from django.urls import reverse
from django.utils import timezone

from scheduler.models import JobState
from scheduler.snapshot.quota_usage import quota_rows
from tenants.models import (
    ApprovalPolicy,
    ApprovalRequest,
    AuditEntry,
    Membership,
    PriorityDefault,
    Quota,
)
from tests import factories as f
from tests.conftest import Org

# --- quota use ----------------------------------------------------------------------------


def test_use_sums_active_allocations_of_the_subtree_by_landed_flavor(org: Org) -> None:
    h100, a100 = f.NodeFactory(flavor="H100-80GB"), f.NodeFactory(flavor="A100-40GB")

    def job(project: Any, state: str, replicas: int, milli: int, node: Any = h100) -> Any:
        made = f.JobFactory(
            project=project,
            state=state,
            replicas=replicas,
            gpu_milli_per_replica=milli,
            flavors=["A100-40GB", "H100-80GB"],  # it may land on either
        )
        if node is not None:
            f.place(made, node)
        return made

    job(org.proj_alpha, JobState.RUNNING, 2, 4000)  # 8 GPUs on H100
    job(org.proj_alpha, JobState.ADMITTED, 1, 500)  # half a GPU
    job(org.proj_alpha, JobState.BINDING, 1, 1000)  # 1 GPU
    job(org.proj_alpha, JobState.RUNNING, 1, 3000, node=a100)  # 3 GPUs, but of A100
    job(org.proj_alpha, JobState.QUEUED, 4, 8000, node=None)  # waiting: holds nothing
    done = job(org.proj_alpha, JobState.SUCCEEDED, 4, 8000)  # its pods are gone:
    done.allocations.update(ended_at=timezone.now())  # released
    job(org.proj_bravo, JobState.RUNNING, 1, 2000)  # 2 GPUs in a sibling
    rows = {
        (row.tenant.slug, row.flavor.name): row
        for row in quota_rows([org.alpha, org.bravo, org.research])
    }
    # alpha on H100: 8 + 0.5 + 1 = 9.5 GPUs; bravo: 2; research holds both: 11.5
    assert rows["team-alpha", "H100-80GB"].used_milli == 9500
    assert rows["team-bravo", "H100-80GB"].used_milli == 2000
    assert rows["research", "H100-80GB"].used_milli == 11500
    alpha = rows["team-alpha", "H100-80GB"]
    assert alpha.guaranteed_milli == 16000 and alpha.limit_milli == 32000
    assert alpha.used_pct == 30  # 9.5 / 32


def test_quota_page_shows_guaranteed_limit_and_use(org: Org, web_for: Any) -> None:
    running = f.JobFactory(
        project=org.proj_alpha,
        state=JobState.RUNNING,
        replicas=2,
        gpu_milli_per_replica=8000,
        flavors=["H100-80GB"],
    )
    f.place(running)
    html = (
        web_for("alice").get(reverse("portal:tenant-quotas", args=[org.alpha.pk])).content.decode()
    )
    # 2 x 8 = 16 in use of guaranteed 16, limit 32: 50% of the limit
    assert "<b>16</b>" in html and "50% of limit" in html
    assert "set by admins of its parent" in html  # a member sees no form


def test_member_home_shows_team_quota_with_use(org: Org, web_for: Any) -> None:
    mine = f.JobFactory(
        project=org.proj_alpha,
        submitted_by=org.users["alice"],
        name="mine-running",
        state=JobState.RUNNING,
        replicas=1,
        gpu_milli_per_replica=4000,
        flavors=["H100-80GB"],
    )
    f.place(mine)
    html = web_for("alice").get(reverse("portal:home")).content.decode()
    assert "mine-running" in html and "Team quota" in html and "<b>4</b>" in html


def test_department_admin_sets_a_team_quota_and_it_is_audited(org: Org, web_for: Any) -> None:
    body = {"flavor": "H100-80GB", "guaranteed": "12", "limit": "20", "weight": "1"}
    response = web_for("dana").post(reverse("portal:tenant-quotas", args=[org.alpha.pk]), body)
    assert response.status_code == 302
    quota = Quota.objects.get(tenant=org.alpha, flavor=org.h100)
    assert (quota.guaranteed_milli, quota.limit_milli) == (12000, 20000)
    entry = AuditEntry.objects.filter(action__startswith="quota").latest("at")
    assert entry.actor_name == "dana" and entry.before["guaranteed_milli"] == 16000
    assert entry.after["guaranteed_milli"] == 12000


def test_quota_errors_are_inline(org: Org, web_for: Any) -> None:
    body = {"flavor": "H100-80GB", "guaranteed": "12", "limit": "8", "weight": "1"}
    response = web_for("dana").post(reverse("portal:tenant-quotas", args=[org.alpha.pk]), body)
    html = response.content.decode()
    assert response.status_code == 400
    assert "is below its guaranteed" in html.split('id="field-limit"')[1].split("</div>\n</div>")[0]
    assert Quota.objects.get(tenant=org.alpha, flavor=org.h100).limit_milli == 32000


def test_saving_a_quota_keeps_its_per_user_cap(org: Org, web_for: Any) -> None:
    # the form had no per-user cap: every save cleared it
    Quota.objects.filter(tenant=org.alpha, flavor=org.h100).update(user_limit_milli=4000)
    url = reverse("portal:tenant-quotas", args=[org.alpha.pk])
    client = web_for("dana")
    edit = client.get(url, {"flavor": "H100-80GB"})
    assert edit.context["form"]["user_limit"].value() == "4"
    body = {"flavor": "H100-80GB", "guaranteed": "12", "limit": "20", "weight": "1"}
    assert client.post(url, {**body, "user_limit": "4"}).status_code == 302
    assert Quota.objects.get(tenant=org.alpha, flavor=org.h100).user_limit_milli == 4000
    assert client.post(url, body).status_code == 302  # a form without the field: kept
    assert Quota.objects.get(tenant=org.alpha, flavor=org.h100).user_limit_milli == 4000
    assert client.post(url, {**body, "user_limit": ""}).status_code == 302  # blank: no cap
    assert Quota.objects.get(tenant=org.alpha, flavor=org.h100).user_limit_milli is None


def test_saving_a_quota_without_its_lend_limit_keeps_it(org: Org, web_for: Any) -> None:
    # a form post without the field cleared the lend limit, as it did the per-user cap
    Quota.objects.filter(tenant=org.alpha, flavor=org.h100).update(lend_limit_milli=2000)
    url = reverse("portal:tenant-quotas", args=[org.alpha.pk])
    body = {"flavor": "H100-80GB", "guaranteed": "12", "limit": "20", "weight": "1"}
    assert web_for("dana").post(url, body).status_code == 302
    assert Quota.objects.get(tenant=org.alpha, flavor=org.h100).lend_limit_milli == 2000
    assert web_for("dana").post(url, {**body, "lend_limit": ""}).status_code == 302
    assert Quota.objects.get(tenant=org.alpha, flavor=org.h100).lend_limit_milli is None


def test_a_per_user_cap_of_zero_is_kept_and_caps_show_per_model(org: Org, web_for: Any) -> None:
    url = reverse("portal:tenant-quotas", args=[org.alpha.pk])
    body = {"flavor": "H100-80GB", "guaranteed": "16", "limit": "32", "weight": "1"}
    assert web_for("dana").post(url, {**body, "user_limit": "0"}).status_code == 302
    assert Quota.objects.get(tenant=org.alpha, flavor=org.h100).user_limit_milli == 0
    for tenant in (org.acme, org.research, org.alpha):
        Quota.objects.create(
            tenant=tenant,
            flavor=org.a100,
            guaranteed_milli=8000,
            limit_milli=8000,
            user_limit_milli=2000 if tenant == org.alpha else None,
        )
    page = web_for("dana").get(url)
    caps = {
        row.flavor.name: row.user_limit_milli
        for row in page.context["quotas"]
        if row.tenant == org.alpha
    }
    assert caps == {"H100-80GB": 0, "A100-40GB": 2000}
    html = page.content.decode()
    assert '<th class="num">Per user</th>' in html


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("guaranteed", "100000000000000000000"),
        ("limit", "1e20"),
        ("lend_limit", "99999999999.5"),
        ("user_limit", "1e15"),
        ("weight", "1000000000"),
    ],
)
def test_quota_form_refuses_numbers_beyond_bounds(
    org: Org, web_for: Any, field: str, value: str
) -> None:
    # an unbounded decimal overflowed the database column: a 500 (on the root, no parent's
    # quota refuses it first)
    body = {"flavor": "H100-80GB", "guaranteed": "64", "limit": "64", "weight": "1", field: value}
    if field == "limit":
        body["limit"] = body["guaranteed"] = value
    response = web_for("pat").post(reverse("portal:tenant-quotas", args=[org.acme.pk]), body)
    assert response.status_code == 400
    assert response.context["form"].errors[field]
    assert Quota.objects.get(tenant=org.acme, flavor=org.h100).limit_milli == 64000


def test_team_admin_requests_a_quota_change_instead(org: Org, web_for: Any) -> None:
    body = {
        "flavor": "H100-80GB",
        "guaranteed": "16",
        "limit": "40",
        "weight": "1",
        "justification": "new model",
    }
    response = web_for("tina").post(
        reverse("portal:tenant-quotas", args=[org.alpha.pk]), body, follow=True
    )
    assert "requested" in response.content.decode()
    request = ApprovalRequest.objects.get(kind="quota", tenant=org.alpha)
    assert request.payload["values"]["limit_milli"] == 40000
    assert Quota.objects.get(tenant=org.alpha, flavor=org.h100).limit_milli == 32000


def test_member_cannot_post_a_quota(org: Org, web_for: Any) -> None:
    body = {"flavor": "H100-80GB", "guaranteed": "1", "limit": "1", "weight": "1"}
    response = web_for("alice").post(reverse("portal:tenant-quotas", args=[org.alpha.pk]), body)
    assert response.status_code == 403
    assert not ApprovalRequest.objects.exists()


# --- members ------------------------------------------------------------------------------


def test_admin_adds_changes_and_removes_a_member(org: Org, web_for: Any) -> None:
    client = web_for("tina")
    url = reverse("portal:tenant-members", args=[org.alpha.pk])
    assert client.post(url, {"username": "chris", "role": "member"}).status_code == 302
    membership = Membership.objects.get(user=org.users["chris"], tenant=org.alpha)
    client.post(
        reverse("portal:tenant-member-role", args=[org.alpha.pk, membership.pk]),
        {"role": "approver"},
    )
    membership.refresh_from_db()
    assert membership.role == "approver"
    html = client.get(url).content.decode()
    assert 'id="member-chris"' in html
    client.post(reverse("portal:tenant-member-remove", args=[org.alpha.pk, membership.pk]))
    assert not Membership.objects.filter(pk=membership.pk).exists()
    actions = list(AuditEntry.objects.filter(tenant=org.alpha).values_list("action", flat=True))
    assert sum(a.startswith("membership") for a in actions) == 3


def test_unknown_username_is_an_inline_error(org: Org, web_for: Any) -> None:
    response = web_for("tina").post(
        reverse("portal:tenant-members", args=[org.alpha.pk]),
        {"username": "nobody", "role": "member"},
    )
    assert (
        response.status_code == 400 and "No user with this username." in response.content.decode()
    )


def test_member_cannot_manage_members(org: Org, web_for: Any) -> None:
    client = web_for("alice")
    html = client.get(reverse("portal:tenant-members", args=[org.alpha.pk])).content.decode()
    assert "Add a member" not in html
    response = client.post(
        reverse("portal:tenant-members", args=[org.alpha.pk]),
        {"username": "alice", "role": "admin"},
    )
    assert response.status_code == 403
    assert Membership.objects.get(user=org.users["alice"], tenant=org.alpha).role == "member"


# --- priority defaults and policies ------------------------------------------------------


def test_admin_sets_a_priority_default(org: Org, web_for: Any) -> None:
    client = web_for("tina")
    url = reverse("portal:tenant-priorities", args=[org.alpha.pk])
    client.post(url, {"job_type": "batch", "priority_class": "high"})
    assert (
        PriorityDefault.objects.get(tenant=org.alpha, job_type="batch").priority_class.name
        == "high"
    )
    html = client.get(url).content.decode()
    assert "<b>high</b>" in html  # the effective default of batch


def test_admin_adds_and_removes_an_approval_policy(org: Org, web_for: Any) -> None:
    client = web_for("tina")
    url = reverse("portal:tenant-policies", args=[org.alpha.pk])
    client.post(
        url,
        {"rule": "gpus_over", "threshold": "8", "applies_to_jobs": "on", "description": "big jobs"},
    )
    policy = ApprovalPolicy.objects.get(tenant=org.alpha)
    assert "GPUs over 8" in client.get(url).content.decode()
    client.post(reverse("portal:tenant-policy-delete", args=[org.alpha.pk, policy.pk]))
    assert not ApprovalPolicy.objects.exists()


def test_policy_errors_are_inline(org: Org, web_for: Any) -> None:
    response = web_for("tina").post(
        reverse("portal:tenant-policies", args=[org.alpha.pk]),
        {"rule": "priority_at_least", "applies_to_jobs": "on"},
    )
    assert response.status_code == 400
    assert "needs a priority class" in response.content.decode()
    assert not ApprovalPolicy.objects.exists()


def test_edit_link_starts_the_form_from_the_current_values(org: Org, web_for: Any) -> None:
    url = reverse("portal:tenant-quotas", args=[org.alpha.pk])
    html = web_for("dana").get(url, {"flavor": "H100-80GB"}).content.decode()
    assert 'href="?flavor=H100-80GB"' in html
    assert 'name="guaranteed" value="16"' in html and 'name="limit" value="32"' in html
