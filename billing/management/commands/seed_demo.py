"""`manage.py seed_demo`: build the demo organisation and its prices once, and print its logins.

It lives in billing because the demo's prices do: billing sits above the scheduler.

The demo's pending approval requests notify their deciders when seeded, with a link to the
portal: `--host` and `--port` (`make run` passes its own) name where the portal will serve,
as `run_embedded` does for its children, unless the operator set GANTRY_BASE_URL.
"""

import os
from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand

from billing.demo import seed_demo_prices
from common.management.commands.run_embedded import base_url
from scheduler.demo.seed import DEMO_PASSWORD, seed_demo


class Command(BaseCommand):
    help = "Seed the demo organisation (idempotent) and print the demo logins."

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument(
            "--if-enabled",
            action="store_true",
            help="Do nothing unless GANTRY_SEED_DEMO=1 (for container start-up).",
        )
        parser.add_argument("--host", default="127.0.0.1", help="where the portal will serve")
        parser.add_argument(
            "--port",
            type=int,
            help="the portal's port, for the links in the seeded requests' emails "
            "(default: GANTRY_BASE_URL)",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        if options["if_enabled"] and not settings.GANTRY_SEED_DEMO:
            self.stdout.write("GANTRY_SEED_DEMO is off; not seeding.")
            return
        configured = settings.GANTRY_BASE_URL
        if options["port"] is not None and not os.environ.get("GANTRY_BASE_URL"):
            settings.GANTRY_BASE_URL = base_url(options["host"], options["port"])
        try:
            result = seed_demo()
            seed_demo_prices()
        finally:
            settings.GANTRY_BASE_URL = configured
        verb = "Seeded" if result.created else "Already seeded:"
        self.stdout.write(self.style.SUCCESS(f"{verb} demo organisation 'acme'."))
        self.stdout.write(f"Logins (password for all: {DEMO_PASSWORD}):")
        for username, role in result.logins:
            self.stdout.write(f"  {username:<8} {role}")
