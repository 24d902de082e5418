"""Mixed versions during an upgrade's roll (issue 40, docs/upgrading.md): this code runs on a
schema a later release expanded, and refuses to lead on one a later release contracted;
/healthz says which."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

import pytest
from django.db.migrations.recorder import MigrationRecorder
from django.test import Client

from common.releases.records import migration_state
from common.releases.schema import schema_status
from scheduler.daemon.loop import Daemon
from scheduler.daemon.schema_guard import SchemaGuardedLease
from scheduler.models import Job
from tests.daemon.conftest import Env, make_env, watched

EXPAND = ("scheduler", "9001_job_new_column")  # a later release's migrations, unknown here
CONTRACT = ("scheduler", "9002_job_old_column_contract")


@pytest.fixture
def env(db: Any) -> Iterator[Env]:
    yield from watched(make_env())


def apply_later(key: tuple[str, str]) -> None:
    """Stands for a later release's `migrate`: the row this code finds in django_migrations."""
    MigrationRecorder.Migration.objects.create(app=key[0], name=key[1])


def guarded(env: Env, holder: str) -> Daemon:
    lease = SchemaGuardedLease(holder, ttl_s=30)
    made = Daemon(env.backend, lease=lease, clock=env.clock, sleep=lambda _s: None)
    env.daemons.append(made)
    return made


@pytest.mark.parametrize(
    ("later", "state"),
    [((), "ok"), ((EXPAND,), "newer"), ((EXPAND, CONTRACT), "incompatible")],
    ids=["same-release", "expanded-by-the-next", "contracted-by-the-next"],
)
def test_the_schema_state(db: Any, later: tuple[tuple[str, str], ...], state: str) -> None:
    for key in later:
        apply_later(key)
    status = schema_status()
    assert status.state == state
    assert status.unknown == tuple(sorted(later))


def test_a_migration_not_applied_yet_is_behind(db: Any) -> None:
    app, name = "whatif", migration_state()["whatif"]
    MigrationRecorder.Migration.objects.filter(app=app, name=name).delete()
    status = schema_status()
    assert (status.state, status.missing) == ("behind", ((app, name),))
    assert Client().get("/healthz").json()["schema"] == "behind"


def test_the_daemon_leads_on_an_expanded_schema(env: Env) -> None:
    apply_later(EXPAND)
    job = env.submit()
    daemon = guarded(env, "old-release")
    env.run(daemon, seconds=2, cycles=2)
    assert daemon.lease.leading
    job.refresh_from_db()
    assert job.state == "running"


def test_the_daemon_refuses_to_lead_on_a_contracted_schema(env: Env, caplog: Any) -> None:
    apply_later(EXPAND)
    apply_later(CONTRACT)
    job = env.submit()
    daemon = guarded(env, "old-release")
    with caplog.at_level(logging.ERROR, logger="gantry.daemon"):
        env.run(daemon, seconds=2, cycles=3)
    assert not daemon.lease.leading
    assert Job.objects.get(pk=job.pk).state == "queued"  # nothing done by the old code
    refusals = [r.getMessage() for r in caplog.records if "refusing to lead" in r.getMessage()]
    assert len(refusals) == 1, refusals  # said once, not every step
    assert "scheduler.9002_job_old_column_contract" in refusals[0]
    body = Client().get("/healthz").json()
    assert (body["status"], body["schema"]) == ("degraded", "incompatible")


def test_a_leader_steps_down_when_a_contract_step_is_applied_under_it(env: Env) -> None:
    daemon = guarded(env, "old-release")
    env.run(daemon, seconds=2, cycles=1)
    assert daemon.lease.leading
    apply_later(CONTRACT)
    env.run(daemon, seconds=30, cycles=2)  # past a renewal
    assert not daemon.lease.leading
