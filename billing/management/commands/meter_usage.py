"""Meter closed hours now, as the hourly Celery task does (it is safe to run beside it)."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandParser
from django.utils import timezone
from django.utils.dateparse import parse_datetime

from billing.metering.hourly import meter_usage


class Command(BaseCommand):
    help = "Meter every closed hour not metered yet (see docs/billing.md)."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--now",
            help="Meter as if it were this instant (ISO 8601, e.g. 2031-02-01T00:10:00Z).",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        now = timezone.now()
        if options["now"]:
            parsed = parse_datetime(options["now"])
            if parsed is None or parsed.tzinfo is None:
                self.stderr.write("--now: give an ISO 8601 instant with its zone, e.g. ...Z")
                raise SystemExit(2)
            now = parsed
        hours = meter_usage(now=now)
        self.stdout.write(f"metered {hours} hour(s)")
