"""`manage.py backup FILE`: a consistent copy of the installation's database, taken while
it runs (common/releases/backup.py; docs/upgrading.md "Backups")."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from common.releases.backup import BackupError, backup


class Command(BaseCommand):
    help = "Back up the database to FILE (pg_dump's custom format, or a SQLite file)."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("file", type=Path)

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            backup(options["file"])
        except BackupError as exc:
            raise CommandError(str(exc)) from exc
        self.stdout.write(f"backed up to {options['file']}")
