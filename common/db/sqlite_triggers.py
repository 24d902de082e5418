"""SQLite drops a table's triggers when a migration rebuilds the table (Django alters a column
by copying the table). The apps whose invariants live in triggers (scheduler's device shares,
billing's frozen statements) put theirs back after every `migrate` through this."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any


def install_missing(
    connection: Any, tables: Sequence[str], triggers: Mapping[str, str]
) -> list[str]:
    """Create each trigger of `triggers` (name -> CREATE TRIGGER statement) that the SQLite
    database lacks; nothing while any of `tables` does not exist (migrated backwards).
    Returns the names created; a no-op on other databases."""
    if connection.vendor != "sqlite":
        return []
    with connection.cursor() as cursor:
        marks = ", ".join(["%s"] * len(tables))
        cursor.execute(
            f"SELECT count(*) FROM sqlite_master WHERE type = 'table' AND name IN ({marks})",  # noqa: S608
            list(tables),
        )
        if cursor.fetchone()[0] < len(tables):
            return []
        cursor.execute("SELECT name FROM sqlite_master WHERE type = 'trigger'")
        present = {name for (name,) in cursor.fetchall()}
        missing = sorted(set(triggers) - present)
        for name in missing:
            cursor.execute(triggers[name])
    return missing
