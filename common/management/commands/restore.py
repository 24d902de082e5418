"""`manage.py restore FILE`: load a backup into a fresh database (the one DATABASE_URL names;
on PostgreSQL created when missing). Stop every process first; then `migrate` and start them
(common/releases/backup.py; docs/upgrading.md "Backups")."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from common.releases.backup import BackupError, restore


class Command(BaseCommand):
    help = "Restore a backup made by `manage.py backup` into a fresh database."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("file", type=Path)

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            restore(options["file"])
        except BackupError as exc:
            raise CommandError(str(exc)) from exc
        self.stdout.write(f"restored from {options['file']}")
