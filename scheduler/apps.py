from typing import Any

from django.apps import AppConfig
from django.db.models.signals import post_migrate


def _ensure_triggers(sender: Any, using: str = "default", **kwargs: Any) -> None:
    from django.db import connections

    from scheduler.nodes.triggers import ensure_sqlite_triggers

    ensure_sqlite_triggers(connections[using])


class SchedulerConfig(AppConfig):
    name = "scheduler"

    def ready(self) -> None:
        # Approval requests of jobs are settled by the scheduler (tenants cannot import it).
        from scheduler.jobs import approvals

        approvals.register()
        # SQLite drops a table's triggers when a migration rebuilds it: put them back.
        post_migrate.connect(_ensure_triggers, sender=self, dispatch_uid="gantry-sqlite-triggers")
