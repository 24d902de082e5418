"""`manage.py release_record --commit HASH`: the `[[releases]]` entry of this tree for
`releases.toml` (docs/releasing.md): its version, today's date, the commit and each app's
last migration. Prints it; writes nothing."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandParser
from django.utils import timezone

from common.releases.records import migration_state
from common.releases.version import gantry_version


class Command(BaseCommand):
    help = "Print this tree's [[releases]] entry for releases.toml."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--commit", default="", help="the release's commit (40 hex digits)")

    def handle(self, *args: Any, **options: Any) -> None:
        lines = [
            "[[releases]]",
            f'version = "{gantry_version()}"',
            f"date = {timezone.now().date().isoformat()}",
            f'commit = "{options["commit"]}"',
            "[releases.migrations]",
            *(f'{app} = "{name}"' for app, name in migration_state().items()),
        ]
        self.stdout.write("\n".join(lines))
