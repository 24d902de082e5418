"""`manage.py seed_demo`: build the demo organisation and its prices once, and print its logins.

It lives in billing because the demo's prices do: billing sits above the scheduler.
"""

from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand

from billing.demo import seed_demo_prices
from scheduler.demo.seed import DEMO_PASSWORD, seed_demo


class Command(BaseCommand):
    help = "Seed the demo organisation (idempotent) and print the demo logins."

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument(
            "--if-enabled",
            action="store_true",
            help="Do nothing unless GANTRY_SEED_DEMO=1 (for container start-up).",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        if options["if_enabled"] and not settings.GANTRY_SEED_DEMO:
            self.stdout.write("GANTRY_SEED_DEMO is off; not seeding.")
            return
        result = seed_demo()
        seed_demo_prices()
        verb = "Seeded" if result.created else "Already seeded:"
        self.stdout.write(self.style.SUCCESS(f"{verb} demo organisation 'acme'."))
        self.stdout.write(f"Logins (password for all: {DEMO_PASSWORD}):")
        for username, role in result.logins:
            self.stdout.write(f"  {username:<8} {role}")
