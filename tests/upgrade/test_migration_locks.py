"""The migrations of a release, applied on PostgreSQL while the platform is busy, never wait
for a lock nor hold one that others wait for longer than LOCK_TIMEOUT (issue 40).

The database is taken back to the previous release's migrations (releases.toml); when no
migration is newer than it, each app's last migration is taken back and applied again, so the
check always has something to apply. Then a workload of reads and writes on the jobs and on
every table of the migrated apps runs on connections of its own while `migrate` runs. Both
sides run with `lock_timeout`: a migration that waits longer for the workload's locks fails
with LockNotAvailable, and so does a statement of the workload that waits longer for a
migration's. No wall clock is read.
"""

from __future__ import annotations

import threading
from collections import Counter
from typing import Any

import psycopg
import pytest
from django.core.management import call_command
from django.db import connection
from django.db.migrations.executor import MigrationExecutor
from django.db.migrations.loader import MigrationLoader

from common.releases.records import load_releases, migration_state, previous_release
from tests.backup.installation import submit
from tests.conftest import build_org

LOCK_TIMEOUT = "2s"


def release_targets() -> dict[str, str]:
    """app -> the migration to take it back to (its state in the previous release, or the
    one before its last when nothing is newer; "zero" for none)."""
    release = previous_release(load_releases())
    assert release is not None
    current = migration_state()
    targets = {
        app: release.migrations.get(app, "zero")
        for app, last in current.items()
        if release.migrations.get(app) != last
    }
    if targets:
        return targets
    graph = MigrationLoader(None, ignore_no_migrations=True).graph
    for app, last in current.items():
        parents = [name for a, name in graph.node_map[(app, last)].parents if a == app]
        targets[app] = max(parents) if parents else "zero"
    return targets


class Workload:
    """Reads and writes, one statement at a time in autocommit, until stopped."""

    def __init__(self, tables: list[str], job_ids: list[int]) -> None:
        self.tables, self.job_ids = tables, job_ids
        self.stop = threading.Event()
        self.rounds = threading.Condition()
        self.done: Counter[str] = Counter()
        self.blocked: list[str] = []
        self.thread = threading.Thread(target=self.run, daemon=True)

    def run(self) -> None:
        s = connection.settings_dict
        with psycopg.connect(
            dbname=s["NAME"], host=s["HOST"] or None, port=s["PORT"] or None,
            user=s["USER"] or None, password=s["PASSWORD"] or None, autocommit=True,
        ) as conn:  # fmt: skip
            conn.execute(f"SET lock_timeout = '{LOCK_TIMEOUT}'")
            while not self.stop.is_set():
                for statement, args in self.statements():
                    self.execute(conn, statement, args)

    def statements(self) -> list[tuple[str, list[Any]]]:
        with self.rounds:
            n = self.done["rounds"]
            self.done["rounds"] += 1
            self.rounds.notify_all()
        job = self.job_ids[n % len(self.job_ids)]
        return [
            ("SELECT count(*) FROM scheduler_job WHERE state = 'queued'", []),
            ("UPDATE scheduler_job SET reason = %s WHERE id = %s", [f"load {n}", job]),
            *((f'SELECT 1 FROM "{table}" LIMIT 1', []) for table in self.tables),
        ]

    def beside(self, action: str, *args: Any) -> None:
        """The executor's progress callback: each migration starts only once the workload
        has begun a round after the previous one, so the two always overlap."""
        if action != "apply_start":
            return
        with self.rounds:
            seen = self.done["rounds"]
            assert self.rounds.wait_for(lambda: self.done["rounds"] > seen + 1, timeout=60)

    def execute(self, conn: psycopg.Connection[Any], statement: str, args: list[Any]) -> None:
        try:
            conn.execute(statement, args)
            self.done["statements"] += 1
        except psycopg.errors.LockNotAvailable:
            self.blocked.append(statement)
        except psycopg.errors.UndefinedTable:
            pass  # a table the migrations take away and bring back


@pytest.mark.postgresql("locks and lock_timeout are PostgreSQL's")
def test_the_release_migrations_block_nobody(transactional_db: Any) -> None:
    org = build_org()
    jobs = [submit(org, "alice") for _ in range(5)]
    targets = release_targets()
    for app, name in targets.items():
        call_command("migrate", app, name, verbosity=0)
    tables = [t for t in connection.introspection.table_names() if t.split("_")[0] in targets]
    load = Workload(tables, [j.pk for j in jobs])
    load.thread.start()
    try:
        with connection.cursor() as cursor:
            cursor.execute(f"SET lock_timeout = '{LOCK_TIMEOUT}'")
        executor = MigrationExecutor(connection, progress_callback=load.beside)
        # A migration that waits past the timeout raises here (LockNotAvailable).
        executor.migrate(executor.loader.graph.leaf_nodes())
    finally:
        load.stop.set()
        load.thread.join()
        call_command("migrate", verbosity=0)  # the test database as it was, whatever happened
    applied = set(MigrationLoader(connection).applied_migrations)
    assert set(migration_state().items()) <= applied
    assert load.done["rounds"] > 2 * len(targets), "the workload did not run beside migrate"
    assert load.blocked == [], f"blocked longer than {LOCK_TIMEOUT} by a migration"
