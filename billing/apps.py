from typing import Any

from django.apps import AppConfig
from django.db.models.signals import post_migrate


def _ensure_triggers(sender: Any, using: str = "default", **kwargs: Any) -> None:
    from django.db import connections

    from billing.triggers import ensure_triggers

    if connections[using].vendor == "sqlite":
        ensure_triggers(connections[using])


class BillingConfig(AppConfig):
    name = "billing"

    def ready(self) -> None:
        # SQLite drops a table's triggers when a migration rebuilds it: put them back.
        post_migrate.connect(_ensure_triggers, sender=self, dispatch_uid="gantry-billing-triggers")
