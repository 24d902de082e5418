"""Audit entries are append-only: on PostgreSQL a trigger refuses UPDATE and DELETE.

The application has no update or delete path for them either; the trigger is the backstop
against a stray ORM call, a shell session or a bug. TRUNCATE (test teardown) is not affected.
SQLite (the embedded default) gets no trigger.
"""

from django.db import migrations

CREATE = """
CREATE OR REPLACE FUNCTION tenants_auditentry_refuse_change() RETURNS trigger AS $$
BEGIN
    RAISE EXCEPTION 'audit entries are append-only: % refused', TG_OP
        USING ERRCODE = 'integrity_constraint_violation';
END;
$$ LANGUAGE plpgsql;
CREATE TRIGGER tenants_auditentry_append_only
    BEFORE UPDATE OR DELETE ON tenants_auditentry
    FOR EACH ROW EXECUTE FUNCTION tenants_auditentry_refuse_change();
"""
DROP = """
DROP TRIGGER IF EXISTS tenants_auditentry_append_only ON tenants_auditentry;
DROP FUNCTION IF EXISTS tenants_auditentry_refuse_change();
"""


def create_trigger(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(CREATE, params=None)


def drop_trigger(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(DROP, params=None)


class Migration(migrations.Migration):
    dependencies = [("tenants", "0003_governance")]

    operations = [migrations.RunPython(create_trigger, drop_trigger)]
