"""The demo organisation that `make run` seeds: every role, quotas, policies, jobs in states."""

from __future__ import annotations

import subprocess
from io import StringIO
from pathlib import Path
from typing import Any

from django.core.management import call_command
from django.utils import timezone

from billing.models import RateCard
from scheduler.models import Job, JobState
from tenants.models import (
    ApprovalPolicy,
    Membership,
    Notification,
    PlatformRole,
    Quota,
    ResourceFlavor,
    Tenant,
)
from tests import factories as f


def seed() -> str:
    out = StringIO()
    call_command("seed_demo", stdout=out)
    return out.getvalue()


def test_seed_builds_a_realistic_organisation(db: Any) -> None:
    f.seed_priority_classes()
    printed = seed()
    assert "Seeded demo organisation" in printed and "gantry-demo" in printed
    kinds = dict(Tenant.objects.values_list("slug", "kind"))
    assert sum(k == "department" for k in kinds.values()) == 2
    assert sum(k == "team" for k in kinds.values()) == 4
    assert set(Membership.objects.values_list("role", flat=True)) == {"member", "approver", "admin"}
    assert set(PlatformRole.objects.values_list("role", flat=True)) == {"platform_admin", "finance"}
    assert Quota.objects.values("flavor").distinct().count() >= 3
    assert ApprovalPolicy.objects.count() >= 3
    states = set(Job.objects.values_list("state", flat=True))
    assert {JobState.QUEUED, JobState.PENDING_APPROVAL, JobState.CANCELLED} <= states
    for username in ("ana", "nils", "nora", "rita", "fiona", "admin"):
        assert username in printed


def test_seed_twice_changes_nothing(db: Any) -> None:
    f.seed_priority_classes()
    seed()
    jobs, cards = Job.objects.count(), RateCard.objects.count()
    assert "Already seeded" in seed()
    assert Job.objects.count() == jobs
    assert RateCard.objects.count() == cards


def test_every_demo_flavor_has_a_price_so_jobs_show_their_cost(db: Any) -> None:
    """`make run` showed "no rate card of flavor ... covers ..." as every job's cost."""
    f.seed_priority_classes()
    seed()
    now = timezone.now()
    for flavor in ResourceFlavor.objects.all():
        card = RateCard.objects.get(flavor=flavor, valid_to__isnull=True)
        assert card.valid_from < now and card.gpu_hour > 0, flavor.name
        assert card.created_by is not None and card.created_by.username == "admin"


def test_if_enabled_respects_the_setting(db: Any, settings: Any) -> None:
    settings.GANTRY_SEED_DEMO = False
    out = StringIO()
    call_command("seed_demo", "--if-enabled", stdout=out)
    assert "not seeding" in out.getvalue()
    assert not Tenant.objects.exists()


def test_the_seeded_requests_emails_link_to_the_port_make_run_serves_on(
    db: Any, settings: Any, monkeypatch: Any
) -> None:
    """`make run PORT=8123` mailed the seeded requests' deciders links to port 8000 (the
    settings' default): the seed ran before `run_embedded` set the address."""
    f.seed_priority_classes()
    monkeypatch.delenv("GANTRY_BASE_URL", raising=False)
    settings.GANTRY_BASE_URL = "http://127.0.0.1:8000"
    call_command("seed_demo", "--port", "8123", stdout=StringIO())
    texts = [n.payload["text"] for n in Notification.objects.filter(kind="approval_needed")]
    assert texts and all("http://127.0.0.1:8123/approvals/" in t for t in texts), texts
    assert settings.GANTRY_BASE_URL == "http://127.0.0.1:8000"  # this process's, as it was
    make = subprocess.run(
        ["make", "-n", "run", "PORT=8123"],
        capture_output=True,
        text=True,
        check=True,
        cwd=Path(__file__).resolve().parents[1],  # the repository's Makefile
    ).stdout
    assert "manage.py seed_demo --host 127.0.0.1 --port 8123" in make


def test_an_operators_base_url_is_kept(db: Any, settings: Any, monkeypatch: Any) -> None:
    f.seed_priority_classes()
    monkeypatch.setenv("GANTRY_BASE_URL", "https://gantry.example.com")
    settings.GANTRY_BASE_URL = "https://gantry.example.com"
    call_command("seed_demo", "--port", "8123", stdout=StringIO())
    texts = [n.payload["text"] for n in Notification.objects.filter(kind="approval_needed")]
    assert texts and all("https://gantry.example.com/approvals/" in t for t in texts)
