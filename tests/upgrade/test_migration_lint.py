"""The migration linter of `make check` (issue 40): it passes on the tree, it fails on a
flagged migration nobody let through, and every migration let through shipped in a recorded
release, with its reason (migration-linter.toml)."""

from __future__ import annotations

from typing import Any

import pytest
from django.core.management import CommandError, call_command
from django.db.migrations.loader import MigrationLoader

from common.management.commands import lint_migrations
from common.releases.records import load_releases, previous_release


def test_every_migration_let_through_shipped_in_a_release_with_a_reason() -> None:
    on_disk = MigrationLoader(None, ignore_no_migrations=True).disk_migrations
    release = previous_release(load_releases())
    assert release is not None
    for key, reason in lint_migrations.ignored_migrations().items():
        app, name = key.split(".", 1)
        assert (app, name) in on_disk, f"{key} names no migration"
        assert name <= release.migrations[app], f"{key} is newer than release {release.version}"
        assert len(reason) > 40, f"{key}: say why it was let through"


@pytest.mark.postgresql("the linter reads the SQL PostgreSQL's backend writes")
def test_the_linter_passes_on_the_tree(db: Any) -> None:
    call_command("lint_migrations", verbosity=0)


@pytest.mark.postgresql("the linter reads the SQL PostgreSQL's backend writes")
def test_a_not_null_column_without_a_database_default_fails(db: Any, monkeypatch: Any) -> None:
    """scheduler 0022 adds a NOT NULL column the old release does not write: unlisted, it
    fails the check."""
    listed = lint_migrations.ignored_migrations()
    del listed["scheduler.0022_xid_event_count"]
    monkeypatch.setattr(lint_migrations, "ignored_migrations", lambda: listed)
    with pytest.raises(CommandError, match="break the previous release"):
        call_command("lint_migrations", "scheduler", verbosity=0)
