"""The backstop of docs/faults.md 19: the children's guarantees of a flavor never exceed the
parent's.

`quota_set` checks this under a row lock on the parent's quota, with a clear message; this
PostgreSQL constraint trigger refuses any write that slips past it (a bug, a shell session, two
approvals racing through a path that forgot the lock). It takes the same lock (the parent's
quota row, FOR UPDATE) before summing, so concurrent sibling raises serialise here too.
SQLite (the embedded default, one writer at a time) gets no trigger.
"""

from django.db import migrations

CREATE = """
CREATE OR REPLACE FUNCTION tenants_quota_children_fit() RETURNS trigger AS $$
DECLARE
    parent bigint;
    parent_guaranteed bigint;
    children bigint;
BEGIN
    -- 1. this row as a child: its siblings and it fit the parent's guarantee
    SELECT t.parent_id INTO parent FROM tenants_tenant t WHERE t.id = NEW.tenant_id;
    IF parent IS NOT NULL THEN
        SELECT q.guaranteed_milli INTO parent_guaranteed FROM tenants_quota q
            WHERE q.tenant_id = parent AND q.flavor_id = NEW.flavor_id FOR UPDATE;
        SELECT COALESCE(SUM(q.guaranteed_milli), 0) INTO children FROM tenants_quota q
            JOIN tenants_tenant t ON t.id = q.tenant_id
            WHERE t.parent_id = parent AND q.flavor_id = NEW.flavor_id;
        IF children > COALESCE(parent_guaranteed, 0) THEN
            RAISE EXCEPTION 'quota: children of tenant % guarantee % milli-GPU of flavor %, '
                'above the parent''s %', parent, children, NEW.flavor_id,
                COALESCE(parent_guaranteed, 0)
                USING ERRCODE = 'check_violation',
                      CONSTRAINT = 'quota_children_fit_parent';
        END IF;
    END IF;
    -- 2. this row as a parent: it still holds its children's guarantees
    SELECT COALESCE(SUM(q.guaranteed_milli), 0) INTO children FROM tenants_quota q
        JOIN tenants_tenant t ON t.id = q.tenant_id
        WHERE t.parent_id = NEW.tenant_id AND q.flavor_id = NEW.flavor_id;
    IF children > NEW.guaranteed_milli THEN
        RAISE EXCEPTION 'quota: tenant % guarantees % milli-GPU of flavor %, below its '
            'children''s %', NEW.tenant_id, NEW.guaranteed_milli, NEW.flavor_id, children
            USING ERRCODE = 'check_violation', CONSTRAINT = 'quota_children_fit_parent';
    END IF;
    RETURN NULL;
END;
$$ LANGUAGE plpgsql;
CREATE CONSTRAINT TRIGGER quota_children_fit_parent
    AFTER INSERT OR UPDATE OF guaranteed_milli, tenant_id, flavor_id ON tenants_quota
    DEFERRABLE INITIALLY IMMEDIATE
    FOR EACH ROW EXECUTE FUNCTION tenants_quota_children_fit();
"""
DROP = """
DROP TRIGGER IF EXISTS quota_children_fit_parent ON tenants_quota;
DROP FUNCTION IF EXISTS tenants_quota_children_fit();
"""


def create_trigger(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(CREATE, params=None)


def drop_trigger(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(DROP, params=None)


class Migration(migrations.Migration):
    dependencies = [("tenants", "0004_audit_append_only")]

    operations = [migrations.RunPython(create_trigger, drop_trigger)]
