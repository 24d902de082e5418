"""The demo load generator skips a submission the installation refuses (issue 34, item 23):
a per-user cap of 0 or a renamed flavor failed every cycle it ran in."""

from __future__ import annotations

import logging
from typing import Any

import pytest
from django.test import Client

from scheduler.demo.load import DemoLoad, Template
from scheduler.models import Job
from tenants.models import Quota
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
