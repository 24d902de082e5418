"""Closed statements and their lines are append-only, on PostgreSQL and SQLite
(billing/statements/guards.py; SQLite's are put back after every migrate as well)."""

from django.db import migrations


def install(apps, schema_editor):
    from billing.statements.guards import ensure_triggers

    ensure_triggers(schema_editor.connection)


def remove(apps, schema_editor):
    from billing.statements.guards import SQLITE, TABLES

    connection = schema_editor.connection
    if connection.vendor == "postgresql":
        for table in TABLES:
            schema_editor.execute(f"DROP TRIGGER IF EXISTS {table}_frozen ON {table}")
        schema_editor.execute("DROP FUNCTION IF EXISTS billing_refuse_change()")
    elif connection.vendor == "sqlite":
        for name in SQLITE:
            schema_editor.execute(f"DROP TRIGGER IF EXISTS {name}")


class Migration(migrations.Migration):
    dependencies = [("billing", "0003_statements")]

    operations = [migrations.RunPython(install, remove)]
