"""The upgrade test (issue 40, docs/upgrading.md): the previous release recorded in
releases.toml, running on PostgreSQL with its daemon on the simulated cluster and jobs of
every kind, upgraded to the current tree as the docs say, with jobs running throughout: on
the simulated cluster, and on the real control plane with the Kubernetes backend
(tests/upgrade/worlds.py; `kubernetes`-marked, run when the plane is built).

1. The old tree (tests/upgrade/previous.py) migrates its own database and fills it
   (tests/backup/installation.py: running, queued, awaiting approval, borrowed, a gang, a
   fractional GPU, quotas, audit, a metered hour and its statement), in a process of its own
   (tests/upgrade/old_side.py) whose daemon leads, on a fake clock.
2. Expand: the current tree's `manage.py migrate` runs while the old daemon keeps cycling.
3. The web rolled: this process (the current tree) submits through the API while the old
   daemon still leads, and the old daemon places the job.
4. The daemon rolled: the old leader steps down, the current tree's daemon (a new process's
   cluster object on the same state file) takes the lease; an old standby stays beside it.
5. Afterwards: no running pod started again, no job lost or doubled, quotas, the audit log,
   usage, statements and the cost lines of the hour before identical, and the queue goes on.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
from django.db import connection
from django.db.models import Count, F, Q
from rest_framework.test import APIClient

from common.releases.records import REPO_ROOT, load_releases, previous_release
from scheduler.daemon.loop import Daemon
from scheduler.daemon.schema_guard import SchemaGuardedLease
from scheduler.models import Job
from tests.backup.installation import cost_lines, every_row
from tests.conftest import job_spec
from tests.daemon.conftest import FakeClock, assert_consistent
from tests.databases import create_database, database_named, pg_url
from tests.k8s.real_plane import RealPlane, real_plane
from tests.upgrade.previous import OldTree, check_out, remove, unavailable
from tests.upgrade.worlds import KubernetesWorld, SimulatedWorld

__all__ = ["real_plane"]  # the session fixture, for this module
World = SimulatedWorld | KubernetesWorld

OLD_SIDE = Path(__file__).with_name("old_side.py")
# What an upgrade must leave as it was: every row that existed before, field for field.
KEPT = ("tenants", "billing")


def has_history() -> bool:
    probe = ["git", "-C", str(REPO_ROOT), "rev-parse", "--git-dir"]
    return (
        shutil.which("git") is not None
        and subprocess.run(probe, capture_output=True).returncode == 0
    )


class OldProcess:
    """The old tree's process (old_side.py), one JSON command and answer at a time."""

    def __init__(self, tree: OldTree, env: dict[str, str], log: Path) -> None:
        self.log = log
        self.stderr = log.open("w")
        # The old tree first on the path: every project module it imports is the old one's.
        self.proc = subprocess.Popen(
            [tree.python, str(OLD_SIDE)], cwd=tree.path, env={**env, "PYTHONPATH": str(tree.path)},
            text=True, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.stderr,
        )  # fmt: skip

    def ask(self, do: str, **args: Any) -> dict[str, Any]:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(json.dumps({"do": do, **args}) + "\n")
        self.proc.stdin.flush()
        for line in self.proc.stdout:
            if line.startswith("{"):
                answer: dict[str, Any] = json.loads(line)
                assert "error" not in answer, f"old side: {answer}\n{self.tail()}"
                return answer
        raise AssertionError(f"the old side exited ({self.proc.wait()}):\n{self.tail()}")

    def tail(self) -> str:
        return self.log.read_text()[-6000:]

    def close(self) -> None:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        if self.proc.poll() is None:
            self.proc.stdin.write('{"do": "quit"}\n')
        for stream in (self.proc.stdin, self.proc.stdout, self.stderr):
            stream.close()
        try:
            self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


@pytest.fixture
def old_tree(tmp_path: Path) -> Iterator[OldTree]:
    if not has_history():
        pytest.skip("no git history in this copy of the tree")
    release = previous_release(load_releases())
    assert release is not None, "releases.toml records no release"
    if (why := unavailable(release.commit)) is not None:
        pytest.skip(why)
    tree = check_out(release, tmp_path)
    try:
        yield tree
    finally:
        remove(tree)


def process_env(database: str, tmp_path: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("REDIS_URL", "PYTHONPATH")}
    return env | {
        "DATABASE_URL": pg_url(database),
        "GANTRY_VAR_DIR": str(tmp_path / "var"),  # the filesystem broker: no worker runs
        "DJANGO_SETTINGS_MODULE": "config.settings",
    }


def rows_kept(before: dict[str, str], after: dict[str, str]) -> list[str]:
    """The rows of `before` (models of KEPT) missing from `after` or with a field changed;
    fields `after` has beyond them (a column the upgrade added) are not compared."""
    changed = []
    for label, text in before.items():
        if label.split(".")[0] not in KEPT:
            continue
        now = {row["pk"]: row["fields"] for row in json.loads(after.get(label, "[]"))}
        for row in json.loads(text):
            fields = now.get(row["pk"])
            if fields is None or any(fields.get(k) != v for k, v in row["fields"].items()):
                changed.append(f"{label} {row['pk']}: {row['fields']} -> {fields}")
    return changed


@pytest.mark.postgresql("the upgrade path of installations, which run on PostgreSQL")
def test_an_upgrade_from_the_previous_release_with_jobs_running(
    django_db_blocker: Any, old_tree: OldTree, tmp_path: Path
) -> None:
    world = SimulatedWorld(tmp_path / "simulated-cluster.state")
    with django_db_blocker.unblock():
        run_upgrade(world, old_tree, tmp_path)


@pytest.mark.kubernetes
@pytest.mark.postgresql("the upgrade path of installations, which run on PostgreSQL")
def test_an_upgrade_on_the_real_control_plane(
    django_db_blocker: Any, old_tree: OldTree, tmp_path: Path, real_plane: RealPlane
) -> None:
    if real_plane.plane is None:
        pytest.skip("the upgrade test plays its nodes' kubelets: it needs the devcluster plane")
    with django_db_blocker.unblock(), KubernetesWorld(real_plane).running() as world:
        run_upgrade(world, old_tree, tmp_path)


def run_upgrade(world: World, old_tree: OldTree, tmp_path: Path) -> None:
    # A database of its own, not the test database: nothing to flush afterwards.
    database = f"{connection.settings_dict['NAME']}_upgrade_{os.getpid()}"[:63]
    create_database(database)
    env = process_env(database, tmp_path) | world.env()
    old = OldProcess(old_tree, env, tmp_path / "old-side.log")
    try:
        with database_named(database):
            upgrade(old, env, world)
    finally:
        old.close()


def upgrade(old: OldProcess, env: dict[str, str], world: World) -> None:
    # 1. the old release, filled, its daemon leading
    filled = old.ask("setup", backend=world.kind)
    hour = datetime.fromisoformat(filled["hour"])
    before = old.ask("rows")["rows"]
    costs_before = old.ask("costs", hour=filled["hour"])["costs"]
    clock = FakeClock(filled["clock"])
    pods_before = world.pods(clock)
    running = set(Job.objects.filter(state="running").values_list("pk", "attempt"))
    assert len(running) == 5 and len(pods_before) == 6, (running, pods_before)
    assert {"tenants.AuditEntry", "billing.StatementLine", "billing.UsageRecord"} <= {
        label for label, text in before.items() if json.loads(text)
    }
    assert costs_before["results"], costs_before

    # 2. expand: the current tree migrates while the old daemon cycles
    old.ask("run")
    migrate = subprocess.run(
        [sys.executable, "manage.py", "migrate", "--noinput"], cwd=REPO_ROOT, env=env,
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    state = old.ask("pause")
    assert migrate.returncode == 0, migrate.stderr[-4000:]
    assert state["leading"] and state["cycles"] > 0 and not state["failures"], (state, old.tail())

    # 3. the web rolled: a job through the current API, placed by the old daemon
    api = APIClient()
    api.force_authenticate(Job.objects.get(pk=filled["jobs"]["cancelled"]).submitted_by)
    spec = job_spec(replicas=1, resources={"gpus": 1}, simulation={"duration_s": 100_000})
    project = Job.objects.get(pk=filled["jobs"]["cancelled"]).project_id
    response = api.post("/api/v1/jobs/", {"project": project, "spec": spec}, format="json")
    assert response.status_code == 201, response.json()
    during = response.json()["id"]
    state = old.ask("settle")
    assert state["leading"] and state["cycle_failures"] == 0, (state, old.tail())
    assert Job.objects.get(pk=during).state == "running"

    # 4. the daemon rolled: the current tree's daemon takes over; an old standby stays
    clock.t = state["clock"]
    backend = world.backend(clock)
    new = Daemon(backend, lease=SchemaGuardedLease("new-leader", ttl_s=30), clock=clock,
                 sleep=lambda _s: None)  # fmt: skip
    new.step()
    assert not new.lease.leading  # a standby while the old leader leads
    old.ask("standby")
    world.settle(new, clock)
    assert new.lease.leading
    assert not old.ask("steps", n=2)["leading"]

    # 5. what the upgrade must leave as it was
    assert world.created(backend) == 0, "a pod was started again"
    pods_after = world.pods(clock)
    assert {n: pods_after.get(n) for n in pods_before} == pods_before, "a pod was started again"
    assert running <= set(Job.objects.values_list("pk", "attempt").filter(state="running"))
    ids = set(filled["jobs"].values()) | {during}
    assert set(Job.objects.values_list("pk", flat=True)) == ids  # none lost, none doubled
    doubled = (
        Job.objects.annotate(
            live=Count("allocations", filter=Q(allocations__ended_at__isnull=True))
        )
        .exclude(live=0)
        .exclude(live=F("replicas"))
    )
    assert not doubled.exists(), list(doubled.values("pk", "live"))
    assert rows_kept(before, every_row()) == []
    assert cost_lines(hour) == costs_before
    assert_consistent(backend)
    # the queue goes on
    spec = {**spec, "resources": {"gpus": 2}}
    response = api.post("/api/v1/jobs/", {"project": project, "spec": spec}, format="json")
    assert response.status_code == 201, response.json()
    world.settle(new, clock)
    assert Job.objects.get(pk=response.json()["id"]).state == "running"
