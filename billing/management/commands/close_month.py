"""Close a month's statements for every organisation (idempotent: a closed one is kept)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.utils.dateparse import parse_datetime

from billing.metering.hourly import meter_caught_up
from billing.periods import month_bounds
from billing.statements.closing import statement_close
from common.errors import DomainError
from tenants.models import Tenant


class Command(BaseCommand):
    help = "Meter everything due, then close the statements of a month (YYYY-MM, UTC)."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("month", help="The month to close, e.g. 2031-01.")
        parser.add_argument("--now", help="Act as if it were this instant (ISO 8601, with zone).")

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            start, end = month_bounds(options["month"])
        except ValueError:
            raise CommandError(f"month: {options['month']!r} is not YYYY-MM.") from None
        now = parse_datetime(options["now"]) if options["now"] else datetime.now(UTC)
        if now is None or now.tzinfo is None:
            raise CommandError("--now: give an ISO 8601 instant with its zone, e.g. ...Z")
        # Everything due, however long since the last run (a run meters at most a week).
        meter_caught_up(now=now, progress=self._progress)
        for organisation in Tenant.objects.filter(parent__isnull=True):
            try:
                statement = statement_close(
                    user=None, organisation=organisation, start=start, end=end, now=now
                )
            except DomainError as error:
                raise CommandError(f"{organisation.slug}: {error}") from None
            lines = statement.lines.count()
            self.stdout.write(f"{organisation.slug}: statement {statement.pk}, {lines} line(s)")

    def _progress(self, done: int, due: int) -> None:
        self.stdout.write(f"metered {done} of {due} hour(s) due")
