"""Operations for migrations written to run while the previous release runs (docs/upgrading.md,
"Migrations"): what Django's own operations do not say."""

from __future__ import annotations

from typing import Any

from django.db.migrations.operations.base import Operation


class OnVendor(Operation):
    """Run `operation` on the database only on `vendor`; its state change always (the
    operations after it inside `SeparateDatabaseAndState` see it)."""

    reduces_to_sql = True
    reversible = True

    def __init__(self, vendor: str, operation: Operation) -> None:
        self.vendor = vendor
        self.operation = operation

    def deconstruct(self) -> tuple[str, list[Any], dict[str, Any]]:
        return (self.__class__.__name__, [self.vendor, self.operation], {})

    def state_forwards(self, app_label: str, state: Any) -> None:
        self.operation.state_forwards(app_label, state)

    def database_forwards(
        self, app_label: str, schema_editor: Any, from_state: Any, to_state: Any
    ) -> None:
        if schema_editor.connection.vendor == self.vendor:
            self.operation.database_forwards(app_label, schema_editor, from_state, to_state)

    def database_backwards(
        self, app_label: str, schema_editor: Any, from_state: Any, to_state: Any
    ) -> None:
        if schema_editor.connection.vendor == self.vendor:
            self.operation.database_backwards(app_label, schema_editor, from_state, to_state)

    def describe(self) -> str:
        return f"On {self.vendor}: {self.operation.describe()}"
