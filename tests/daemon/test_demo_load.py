"""The demo load generator skips a submission the installation refuses (issue 34, item 23):
a per-user cap of 0 or a renamed flavor failed every cycle it ran in. Its jobs stay under
the demo's approval policies, and a policy that catches them anyway costs the approvers a
bounded number of requests (issue 35, "Smaller things")."""

from __future__ import annotations

import logging
from typing import Any

import pytest
from django.contrib.auth import get_user_model
from django.test import Client

from scheduler.demo.load import TEMPLATES, DemoLoad, Template
from scheduler.demo.seed import seed_demo
from scheduler.models import Job
from tenants.approval_policies import policy_set
from tenants.models import ApprovalRequest, Notification, NotificationKind, Quota, Tenant
from tests import factories as f
from tests.daemon.conftest import Env

# alice asks for one H100 in proj-alpha (tests/conftest.py's organisation)
ALICE: Template = ("alice", "proj-alpha", "probe", "batch", 1, 1, "H100-80GB", (60, 60), {})


def cap_alice_at_zero(env: Env) -> None:
    Quota.objects.filter(tenant=env.org.alpha, flavor=env.org.h100).update(user_limit_milli=0)


def rename_h100(env: Env) -> None:
    env.org.h100.name = "H100-SXM-80GB"
    env.org.h100.save(update_fields=["name"])


@pytest.mark.parametrize("refuse", [cap_alice_at_zero, rename_h100], ids=["user-cap-0", "rename"])
def test_a_refused_demo_submission_is_skipped_and_said_once(
    env: Env, refuse: Any, caplog: pytest.LogCaptureFixture
) -> None:
    refuse(env)
    load = DemoLoad(env.clock, every_s=10, seed=1, templates=[ALICE])
    daemon = env.daemon(on_cycle=load.tick)
    caplog.set_level(logging.DEBUG, logger="gantry.demo")
    for _ in range(6):  # every_s 10: the next tick is 5-15 s away, so each cycle submits
        env.run(daemon, seconds=16)
        assert daemon.errors == 0 and daemon.last is not None
    assert daemon.cycle_no == 6 and Job.objects.count() == 0
    said = [r for r in caplog.records if r.name == "gantry.demo"]
    warned = [r for r in said if r.levelno == logging.WARNING]
    assert len(said) == 6 and len(warned) == 1, [r.getMessage() for r in said]
    assert "alice's probe job was refused, skipped" in warned[0].getMessage()
    assert ("at most 0" if refuse is cap_alice_at_zero else "H100-80GB") in warned[0].getMessage()
    body = Client().get("/healthz").json()
    assert body["scheduler"] == "ok"


SUBMISSIONS = 140  # 20 rounds of the demo's 7 templates


def demo_load_run(ticks: int, templates: list[Template] | None = None) -> DemoLoad:
    """The demo load on the seeded demo, `ticks` times on a clock that moves past each next
    tick; the queue bound is lifted (no daemon runs here to admit anything)."""
    now = [0.0]
    load = DemoLoad(lambda: now[0], every_s=10, max_queued=10**6, seed=7, templates=templates)
    for _ in range(ticks):
        now[0] += 20  # every_s 10: the next tick is at most 15 s away
        load.tick()
    return load


def test_the_demo_load_stays_out_of_the_approvers_inboxes(db: Any) -> None:
    """`make run` piled the load's jobs into the approvers' inboxes and mail (issue 35,
    "Smaller things"): product's 48-hour policy caught every job without a maximum runtime
    (chat-canary, ~1 in 7 submissions). The load's jobs now stay under the seeded policies."""
    f.seed_priority_classes()
    seed_demo()
    seeded = ApprovalRequest.objects.count()  # the demo's own: llama-70b-pretrain, chat-7b-serving
    asked = Notification.objects.filter(kind=NotificationKind.APPROVAL_NEEDED).count()
    load = demo_load_run(SUBMISSIONS)
    submitted = Job.objects.filter(name__regex=r"-\d+$").count()
    assert load.count == submitted >= SUBMISSIONS * 0.9, (load.count, submitted)
    assert ApprovalRequest.objects.count() == seeded
    assert Notification.objects.filter(kind=NotificationKind.APPROVAL_NEEDED).count() == asked


def test_a_policy_that_catches_the_load_costs_the_approvers_one_request_per_template(
    db: Any,
) -> None:
    """An admin's policy the load does not know (every job over 0 GPUs, at the root): each
    template waits while its last job waits for approval, so the inbox stays bounded."""
    f.seed_priority_classes()
    seed_demo()
    policy_set(
        user=get_user_model().objects.get(username="admin"),
        tenant=Tenant.objects.get(slug="acme"),
        rule="gpus_over",
        threshold=0,
        priority_class=None,
    )
    seeded = ApprovalRequest.objects.count()
    load = demo_load_run(SUBMISSIONS)
    from_load = ApprovalRequest.objects.count() - seeded
    # 140 ticks, every one of them caught: one request per template, the rest not submitted
    assert 0 < from_load == load.count <= len(TEMPLATES), (from_load, load.count)


def test_sped_up_templates_declare_a_maximum_the_spec_accepts(
    db: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """bench.eta's demo runs the templates ten times faster (`scaled_templates`): twice the
    longest run of eval (18 s) and augment (24 s) fell under the spec's least maximum runtime
    (60 s), and both were refused all along, two kinds of job fewer in the load measured."""
    from bench.eta.demo import scaled_templates

    f.seed_priority_classes()
    seed_demo()
    caplog.set_level(logging.WARNING, logger="gantry.demo")
    load = demo_load_run(SUBMISSIONS, templates=scaled_templates(10))
    assert not [r.getMessage() for r in caplog.records if r.name == "gantry.demo"]
    kinds = {name.rsplit("-", 1)[0] for name in Job.objects.values_list("name", flat=True)}
    assert {t[2] for t in TEMPLATES} <= kinds, kinds
    assert load.count >= SUBMISSIONS * 0.9
    short = Job.objects.filter(name__startswith="eval-").values_list("spec", flat=True)
    assert short and all(spec["max_runtime_s"] == 60 for spec in short)
