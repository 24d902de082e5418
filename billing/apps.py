from typing import Any

from django.apps import AppConfig
from django.db.models.signals import post_migrate


def _ensure_triggers(sender: Any, using: str = "default", **kwargs: Any) -> None:
    from django.db import connections

    from billing.statements.guards import ensure_triggers

    if connections[using].vendor == "sqlite":
        ensure_triggers(connections[using])


class BillingConfig(AppConfig):
    name = "billing"

    def ready(self) -> None:
        # SQLite drops a table's triggers when a migration rebuilds it: put them back.
        post_migrate.connect(_ensure_triggers, sender=self, dispatch_uid="gantry-billing-triggers")
        # Budgets and cost rules at admission (the scheduler may not import billing).
        from billing.budgets import approval as approving
        from billing.budgets import checks as admission
        from scheduler.jobs.hooks import (
            register_approving_check,
            register_on_enqueued,
            register_on_final,
            register_submit_check,
        )

        register_submit_check(admission.budget_admission_check)
        register_approving_check(approving.budget_approving_check)
        register_on_enqueued(admission.reservation_make)
        register_on_final(admission.reservations_release)
        # The reconciliation of allocations against usage records, on /metrics.
        from billing.metering.gaps import usage_check_families
        from scheduler.metrics.exporter import register_families

        register_families(usage_check_families)
