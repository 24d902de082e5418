"""`manage.py lint_migrations`: django-migration-linter over every migration of the
project's apps, as PostgreSQL runs them (`make check`; docs/upgrading.md "Migrations").

It refuses what breaks the release still running beside the new schema during an upgrade
(a column dropped or renamed, NOT NULL without a default, a table renamed...): such a change
is split into an expand step in one release and a contract step in the next. The migrations
it flags that already shipped in a release are listed with the reason in
`migration-linter.toml` ([ignore], "app.migration" = "why");
`tests/upgrade/test_migration_lint.py` keeps that list honest.
"""

from __future__ import annotations

import logging
import tomllib
from collections.abc import Iterable
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import connection

from common.releases.records import REPO_ROOT, project_apps

CONFIG = REPO_ROOT / "migration-linter.toml"


def ignored_migrations() -> dict[str, str]:
    """ "app.migration" -> why it is let through."""
    return dict(tomllib.loads(CONFIG.read_text()).get("ignore", {}))


class Command(BaseCommand):
    help = "Lint the project's migrations for changes that break the previous release."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("app_label", nargs="?", help="one app only (default: every app)")

    def handle(self, *args: Any, **options: Any) -> None:
        # The linter is a development dependency: loaded only when this command runs.
        from django_migration_linter import MigrationLinter

        if connection.vendor != "postgresql":
            raise CommandError("lint migrations as PostgreSQL runs them: set DATABASE_URL")
        ignored = set(ignored_migrations())
        # It logs each sqlmigrate call at INFO; its summary says what matters.
        logging.getLogger("django_migration_linter").setLevel(logging.WARNING)

        class Linter(MigrationLinter):
            def should_ignore_migration(
                self,
                app_label: str,
                migration_name: str,
                operations: Iterable[Any] = (),
                is_initial: bool = False,
            ) -> bool:
                return (
                    f"{app_label}.{migration_name}" in ignored
                    or super().should_ignore_migration(
                        app_label, migration_name, operations, is_initial
                    )
                )

        linter = Linter(
            str(REPO_ROOT),
            include_apps=project_apps(),
            no_cache=True,
            analyser_string="postgresql",
            # A plain CREATE INDEX (a warning to the linter) blocks writes to a table in use.
            all_warnings_as_errors=True,
            no_output=options["verbosity"] == 0,
        )
        linter.lint_all_migrations(app_label=options["app_label"])
        linter.print_summary()
        if linter.has_errors:
            raise CommandError("migrations that break the previous release: see above")
