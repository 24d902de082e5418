"""`manage.py backup` and `manage.py restore` (issue 40): an installation backed up while it
runs, restored into a fresh database, holds every row it held (jobs in every state, quotas,
approvals, audit, statements), and the daemon started on it adopts the cluster's running
pods instead of starting them again. On both engines: `make test` runs this file on
PostgreSQL and again on SQLite."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from django.core.management import CommandError, call_command
from django.db import connection

from billing.models import Statement, StatementLine, UsageRecord
from scheduler.backends.simulated.inventory import make_nodes
from scheduler.backends.simulated.statefile import PersistentCluster
from scheduler.models import Job
from tenants.models import ApprovalRequest, AuditEntry, Quota
from tests.backup.installation import Filled, every_row, fill, job_states, submit
from tests.conftest import build_org
from tests.daemon.conftest import Env, FakeClock, assert_consistent, expire_leases
from tests.databases import database_named


def cluster(path: Path, clock: FakeClock) -> PersistentCluster:
    nodes = make_nodes(4, "H100-80GB", 8, prefix="h100")
    return PersistentCluster(nodes, path, clock=clock, start_delay_s=1.0, grace_cap_s=2.0)


def fresh_name(tmp_path: Path) -> str:
    if connection.vendor == "postgresql":
        return f"{connection.settings_dict['NAME']}_restored"[:63]
    return str(tmp_path / "restored.sqlite3")


def live_pods(env: Env) -> dict[str, tuple[Any, ...]]:
    return {p.name: (p.node, p.attempt, p.phase) for p in env.backend.list_pods()}


@pytest.fixture
def installation(transactional_db: Any, tmp_path: Path) -> Iterator[tuple[Env, Filled]]:
    clock = FakeClock()
    env = Env(build_org(), clock, cluster(tmp_path / "simulated-cluster.state", clock))
    filled = fill(env, env.daemon("before"))
    yield env, filled


def test_a_restored_installation_holds_everything_and_adopts_the_running_pods(
    installation: tuple[Env, Filled], tmp_path: Path
) -> None:
    env, filled = installation
    states = job_states(filled)
    # the installation holds something of everything (else the comparison proves little)
    assert {s for s, _ in states.values()} == {
        "running",
        "queued",
        "pending_approval",
        "rejected",
        "cancelled",
    }, states
    assert StatementLine.objects.exists() and UsageRecord.objects.exists()
    assert AuditEntry.objects.filter(action__icontains="quota").exists()
    assert ApprovalRequest.objects.filter(state="rejected").exists()
    before = every_row()
    pods = live_pods(env)
    assert len(pods) == 6  # the gang's two, four more

    backup = tmp_path / "gantry.backup"
    call_command("backup", str(backup))
    with database_named(fresh_name(tmp_path)):
        call_command("restore", str(backup))
        assert every_row() == before
        # the daemon of a new process on the restored database: the old one is gone
        env.backend = cluster(env.backend.path, env.clock)
        expire_leases()
        restarted = env.daemon("after-restore")
        env.run(restarted, seconds=2, cycles=3)
        assert restarted.lease.leading
        assert env.backend.calls.get("create_pod", 0) == 0, "a running pod was started again"
        assert live_pods(env) == pods
        assert job_states(filled) == states
        assert_consistent(env.backend)
        # the queue goes on: a new job gets a new id and a place
        late = submit(env.org, "chris", resources={"gpus": 2}, simulation={"duration_s": 60})
        assert late.pk > max(filled.jobs.values())
        env.run(restarted, seconds=2, cycles=2)
        late.refresh_from_db()
        assert late.state in ("binding", "running"), late.reason
        assert (
            Statement.objects.count() == 1
            and Quota.objects.filter(tenant=env.org.charlie, guaranteed_milli=12000).exists()
        )


def test_restore_refuses_a_database_that_is_not_empty(
    installation: tuple[Env, Filled], tmp_path: Path
) -> None:
    backup = tmp_path / "gantry.backup"
    call_command("backup", str(backup))
    before = Job.objects.count()
    with pytest.raises(CommandError, match="is not empty"):
        call_command("restore", str(backup))
    assert Job.objects.count() == before


def test_restore_refuses_a_file_that_is_no_backup(transactional_db: Any, tmp_path: Path) -> None:
    junk = tmp_path / "notes.txt"
    junk.write_text("not a database")
    with pytest.raises(CommandError, match="is not a Gantry backup"):
        call_command("restore", str(junk))
    with pytest.raises(CommandError, match="cannot read"):
        call_command("restore", str(tmp_path / "missing.backup"))
