"""Closed statements are frozen: the database refuses UPDATE and DELETE of their rows.

Nothing in the application changes a statement or a line once written (a correction is an
adjustment line, appended); the triggers are the backstop against a stray ORM call, a shell
session or a bug, on both databases. TRUNCATE (PostgreSQL's test teardown) is not affected.

On SQLite a migration that rebuilds a table drops its triggers (scheduler/triggers.py tells
that story), so `ensure_triggers` runs after every `migrate` (post_migrate) as well as in
migration 0004, and puts back any that is missing.
"""

from __future__ import annotations

from typing import Any

from common.sqlite_triggers import install_missing

TABLES = ("billing_statement", "billing_statementline")

POSTGRESQL = """
CREATE OR REPLACE FUNCTION billing_refuse_change() RETURNS trigger AS $$
BEGIN
    RAISE EXCEPTION '% of a closed statement refused: % is append-only', TG_OP, TG_TABLE_NAME
        USING ERRCODE = 'integrity_constraint_violation';
END;
$$ LANGUAGE plpgsql;
""" + "".join(
    f"""
DROP TRIGGER IF EXISTS {table}_frozen ON {table};
CREATE TRIGGER {table}_frozen BEFORE UPDATE OR DELETE ON {table}
    FOR EACH ROW EXECUTE FUNCTION billing_refuse_change();
"""
    for table in TABLES
)

SQLITE = {
    f"{table}_frozen_{op.lower()}": f"""
        CREATE TRIGGER {table}_frozen_{op.lower()} BEFORE {op} ON {table}
        BEGIN SELECT RAISE(ABORT, '{op} of a closed statement refused: {table} is append-only');
        END;"""
    for table in TABLES
    for op in ("UPDATE", "DELETE")
}


def ensure_triggers(connection: Any) -> list[str]:
    """Install the triggers that are missing; the names installed (all, on PostgreSQL)."""
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute(POSTGRESQL)
        return [f"{table}_frozen" for table in TABLES]
    return install_missing(connection, list(TABLES), SQLITE)
