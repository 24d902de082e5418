"""Browser journeys of issue 3, in headless Chromium against the live server, with screenshots
of the main pages saved to docs/screenshots/."""

from __future__ import annotations

import re
from typing import Any

import pytest
from playwright.sync_api import expect

from scheduler.jobs.services import job_submit
from scheduler.models import Job, JobState
from tenants import approval_policies
from tenants.models import AuditEntry, Quota
from tests import factories as f
from tests.conftest import Org, job_spec
from tests.portal.browser.conftest import PHONE, shoot

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def furnish(org: Org) -> None:
    """A policy that sends big jobs of team-alpha to approvers, an approver, and jobs in
    several states so the pages show real data."""
    approver = f.UserFactory(username="ava")
    f.MembershipFactory(user=approver, tenant=org.alpha, role="approver")
    approval_policies.policy_set(
        user=org.users["tina"],
        tenant=org.alpha,
        rule="gpus_over",
        threshold=4,
        description="More than 4 GPUs needs a team lead",
    )
    alice, bob = org.users["alice"], org.users["bob-bravo"]
    for name, state, replicas, gpus, job_type in [
        ("bert-finetune", JobState.RUNNING, 1, 4, "fine-tuning"),
        ("eval-mmlu", JobState.SUCCEEDED, 1, 1, "evaluation"),
        ("chat-serving", JobState.RUNNING, 2, 1, "inference"),
        ("data-prep", JobState.FAILED, 1, 1, "batch"),
    ]:
        job = f.JobFactory(
            project=org.proj_alpha,
            submitted_by=alice,
            name=name,
            state=state,
            replicas=replicas,
            gpus_per_replica=gpus,
            gpu_milli_per_replica=gpus * 1000,
            job_type=job_type,
            flavors=["H100-80GB"],
        )
        f.JobEventFactory(job=job, kind="state", to_state=state, message=f"{name} is {state}.")
    job_submit(
        user=alice,
        project=org.proj_alpha,
        payload=job_spec(
            name="llama-pretrain",
            replicas=1,
            resources={"gpus": 2, "cpu_milli": 8000, "memory_mib": 65536},
        ),
    )
    f.JobFactory(
        project=org.proj_bravo,
        submitted_by=bob,
        name="bravo-secret-run",
        state=JobState.RUNNING,
        flavors=["H100-80GB"],
    )


def test_member_submits_approver_approves_member_sees_it_queued(org: Org, page_for: Any) -> None:
    furnish(org)
    alice = page_for("alice")
    shoot(alice, "home-member")

    # 1. the member fills the form: 2 replicas x 4 GPUs is over the policy's 4 GPUs
    alice.click("nav >> text=Submit")
    alice.select_option("select[name=job_type]", "inference")
    expect(alice.locator("#field-min_replicas")).to_be_visible()
    expect(alice.locator("input[name=replicas]")).to_have_value("2")
    expect(alice.locator("select[name=priority_class] option").first).to_contain_text("high")
    alice.select_option("select[name=job_type]", "training")
    expect(alice.locator("#field-min_replicas")).to_be_hidden()
    alice.fill("input[name=name]", "Bad Name")
    alice.fill("input[name=command]", "torchrun --nproc-per-node 4 train.py")
    alice.fill("input[name=replicas]", "2")
    alice.fill("input[name=gpus]", "4")
    alice.check("input[name=flavors][value='H100-80GB']")
    alice.click("button:has-text('Submit job')")
    # 2. an inline error, the rest of the form kept
    expect(alice.locator("#field-name .errors")).to_contain_text("is not a valid job name")
    expect(alice.locator("input[name=command]")).to_have_value(
        "torchrun --nproc-per-node 4 train.py"
    )
    alice.fill("input[name=name]", "llama-70b-sft")
    shoot(alice, "submit-form")
    alice.click("button:has-text('Submit job')")
    expect(alice.locator("#job-state")).to_have_text("Pending Approval")
    expect(alice.locator("#job-reason")).to_contain_text("GPUs")
    job = Job.objects.get(name="llama-70b-sft")
    assert job.state == JobState.PENDING_APPROVAL

    # 3. the approver finds it in the inbox and approves it with a comment (HTMX, CSRF header)
    ava = page_for("ava")
    shoot(ava, "home-approver")
    ava.click("nav >> text=Approvals")
    row = ava.locator("tr", has_text="llama-70b-sft")
    expect(row).to_be_visible()
    shoot(ava, "approval-inbox")
    row.locator("textarea[name=comment]").fill("Fine, the cluster is quiet tonight.")
    row.locator("button:has-text('Approve')").click()
    expect(ava.locator("tr", has_text="llama-70b-sft")).to_contain_text("approved")
    job.refresh_from_db()
    assert job.state == JobState.QUEUED

    # 4. the member's open page updates itself (HTMX polling) to queued
    expect(alice.locator("#job-state")).to_have_text("Queued", timeout=15_000)
    expect(alice.locator(".timeline")).to_contain_text("Approved by ava")
    shoot(alice, "job-detail")
    alice.click("nav >> text=Jobs")
    expect(alice.locator("#job-rows")).to_contain_text("llama-70b-sft")
    shoot(alice, "job-list")
    history = ava
    history.goto("/approvals/history/")
    expect(history.locator("body")).to_contain_text("Fine, the cluster is quiet tonight.")
    shoot(history, "approval-history")


def test_admin_changes_a_quota_and_the_audit_log_shows_it(org: Org, page_for: Any) -> None:
    furnish(org)
    dana = page_for("dana")
    shoot(dana, "home-admin")
    dana.goto(f"/tenants/{org.alpha.pk}/quotas/")
    dana.select_option("select[name=flavor]", "H100-80GB")
    dana.fill("input[name=guaranteed]", "12")
    dana.fill("input[name=limit]", "24")
    dana.click("button:has-text('Save quota')")
    expect(dana.locator(".flash-success")).to_contain_text("saved")
    row = dana.locator("#quota-own tr", has_text="H100-80GB")
    expect(row).to_contain_text("12")
    expect(row).to_contain_text("24")
    shoot(dana, "quotas")
    quota = Quota.objects.get(tenant=org.alpha, flavor=org.h100)
    assert (quota.guaranteed_milli, quota.limit_milli) == (12000, 24000)

    dana.click("nav >> text=Tenants")
    dana.click(f"a[href='/tenants/{org.alpha.pk}/members/']")
    expect(dana.locator("#member-alice")).to_contain_text("member")
    shoot(dana, "tenant-members")
    dana.click("nav.tabs >> text=Priorities")
    shoot(dana, "tenant-priorities")
    dana.click("nav.tabs >> text=Approval policies")
    expect(dana.locator("body")).to_contain_text("GPUs over 4")
    shoot(dana, "tenant-policies")
    dana.click("nav >> text=Audit log")
    entry = dana.locator("table.audit tbody tr", has_text="quota.set").first
    expect(entry).to_contain_text("dana")
    expect(entry).to_contain_text("team-alpha")
    expect(entry).to_contain_text("12000")
    shoot(dana, "audit-log")
    assert AuditEntry.objects.filter(action="quota.set", actor_name="dana").count() == 1
    dana.fill("input[name=action]", "quota")
    dana.click("button:has-text('Filter')")
    expect(dana.locator("table.audit tbody tr")).to_have_count(1)
    href = dana.locator("#audit-export").get_attribute("href")
    assert href and "action=quota" in href


def test_member_cannot_open_another_teams_job(org: Org, page_for: Any) -> None:
    furnish(org)
    foreign = Job.objects.get(name="bravo-secret-run")
    alice = page_for("alice")
    response = alice.goto(f"/jobs/{foreign.pk}/")
    assert response is not None and response.status == 404
    expect(alice.locator("h1")).to_have_text("Not found")
    assert "bravo" not in alice.content()
    shoot(alice, "not-found")
    partial = alice.request.get(f"/jobs/{foreign.pk}/status/")
    assert partial.status == 404 and "bravo" not in partial.text()
    alice.goto("/jobs/")
    expect(alice.locator("#job-rows")).not_to_contain_text("bravo")


def test_role_home_pages_and_phone_layout(
    org: Org, page_for: Any, browser: Any, live_server: Any
) -> None:
    furnish(org)
    anonymous = browser.new_page(viewport={"width": 1280, "height": 720})
    anonymous.goto(f"{live_server.url}/jobs/")
    expect(anonymous.locator("h1")).to_contain_text("Sign in to Gantry")
    shoot(anonymous, "login")
    anonymous.close()
    carol = page_for("carol")
    expect(carol.locator("#home-finance")).to_contain_text("Research")
    shoot(carol, "home-finance")
    pat = page_for("pat")
    shoot(pat, "home-platform-admin")
    phone = page_for("alice", viewport=PHONE)
    expect(phone.locator("#home-jobs")).to_contain_text("bert-finetune")
    # nothing sticks out sideways on a phone: the page is no wider than the screen
    width = phone.evaluate("document.documentElement.scrollWidth")
    assert width <= PHONE["width"], width
    shoot(phone, "phone-home")
    phone.goto("/jobs/new/")
    assert phone.evaluate("document.documentElement.scrollWidth") <= PHONE["width"]
    shoot(phone, "phone-submit-form")
    assert re.search(r"Gantry", phone.title())
