"""PostgreSQL only: the allocation NOTIFY trigger finds the allocations that ended in a
statement with EXCEPT, not by joining its transition tables on id.

The transition tables have no index and no statistics, so the join ran as a nested loop: one
UPDATE of n allocations cost n² comparisons. A daemon cycle that bound 10,000 pods (one UPDATE
of their allocations' bound_at) spent longer in the trigger than the daemon's statement timeout
and its commit failed. EXCEPT hashes or sorts both sides: linear.
"""

from django.db import migrations

LINEAR = """
CREATE OR REPLACE FUNCTION gantry_notify_allocation() RETURNS trigger AS $$
BEGIN
  -- The ids that have ended_at now and did not before: allocations that ended here.
  IF EXISTS (SELECT id FROM new_rows WHERE ended_at IS NOT NULL
             EXCEPT SELECT id FROM old_rows WHERE ended_at IS NOT NULL) THEN
    PERFORM pg_notify('gantry_scheduler', 'allocation');
  END IF;
  RETURN NULL;
END $$ LANGUAGE plpgsql;
"""
JOINED = """
CREATE OR REPLACE FUNCTION gantry_notify_allocation() RETURNS trigger AS $$
BEGIN
  IF EXISTS (SELECT 1 FROM new_rows n JOIN old_rows o ON o.id = n.id
             WHERE o.ended_at IS NULL AND n.ended_at IS NOT NULL) THEN
    PERFORM pg_notify('gantry_scheduler', 'allocation');
  END IF;
  RETURN NULL;
END $$ LANGUAGE plpgsql;
"""


def _postgresql(sql: str):
    def run(apps, schema_editor):
        if schema_editor.connection.vendor == "postgresql":
            schema_editor.execute(sql)

    return run


class Migration(migrations.Migration):
    dependencies = [("scheduler", "0017_xid_history")]

    operations = [migrations.RunPython(_postgresql(LINEAR), _postgresql(JOINED))]
