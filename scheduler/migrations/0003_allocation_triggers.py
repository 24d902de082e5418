"""Database triggers the daemon relies on.

1. `GpuDevice.allocated_milli` follows AllocationDevice rows (insert, release, delete), so
   the CHECK `gpu_device_never_overallocated` (0..1000) rejects any write that would give a
   device out twice, whatever code path makes it. On PostgreSQL the triggers are per
   statement over transition tables (one UPDATE per bulk insert, not one per row); the row
   lock the UPDATE takes on each device serialises two writers of the same device.
2. PostgreSQL only: NOTIFY `gantry_scheduler` when a job becomes queued or cancelled, or an
   allocation ends, to wake the daemon (it polls as well).
"""

from django.db import migrations

PG_FORWARD = [
    """
    CREATE OR REPLACE FUNCTION gantry_device_shares() RETURNS trigger AS $$
    BEGIN
      IF TG_OP = 'INSERT' THEN
        UPDATE scheduler_gpudevice d SET allocated_milli = d.allocated_milli + s.delta
        FROM (SELECT device_id, sum(milli) AS delta FROM new_rows WHERE NOT released
              GROUP BY device_id) s
        WHERE d.id = s.device_id;
      ELSIF TG_OP = 'UPDATE' THEN
        UPDATE scheduler_gpudevice d SET allocated_milli = d.allocated_milli + s.delta
        FROM (SELECT device_id, sum(delta) AS delta FROM (
                SELECT device_id, -milli AS delta FROM old_rows WHERE NOT released
                UNION ALL
                SELECT device_id, milli AS delta FROM new_rows WHERE NOT released) x
              GROUP BY device_id HAVING sum(delta) <> 0) s
        WHERE d.id = s.device_id;
      ELSE
        UPDATE scheduler_gpudevice d SET allocated_milli = d.allocated_milli - s.delta
        FROM (SELECT device_id, sum(milli) AS delta FROM old_rows WHERE NOT released
              GROUP BY device_id) s
        WHERE d.id = s.device_id;
      END IF;
      RETURN NULL;
    END $$ LANGUAGE plpgsql;
    """,
    """CREATE TRIGGER gantry_device_shares_ins AFTER INSERT ON scheduler_allocationdevice
       REFERENCING NEW TABLE AS new_rows FOR EACH STATEMENT
       EXECUTE FUNCTION gantry_device_shares();""",
    """CREATE TRIGGER gantry_device_shares_upd AFTER UPDATE ON scheduler_allocationdevice
       REFERENCING OLD TABLE AS old_rows NEW TABLE AS new_rows FOR EACH STATEMENT
       EXECUTE FUNCTION gantry_device_shares();""",
    """CREATE TRIGGER gantry_device_shares_del AFTER DELETE ON scheduler_allocationdevice
       REFERENCING OLD TABLE AS old_rows FOR EACH STATEMENT
       EXECUTE FUNCTION gantry_device_shares();""",
    """
    CREATE OR REPLACE FUNCTION gantry_notify_job() RETURNS trigger AS $$
    BEGIN
      IF EXISTS (SELECT 1 FROM new_rows WHERE state IN ('queued', 'cancelled')) THEN
        PERFORM pg_notify('gantry_scheduler', 'job');
      END IF;
      RETURN NULL;
    END $$ LANGUAGE plpgsql;
    """,
    """CREATE TRIGGER gantry_notify_job_ins AFTER INSERT ON scheduler_job
       REFERENCING NEW TABLE AS new_rows FOR EACH STATEMENT EXECUTE FUNCTION gantry_notify_job();""",
    """CREATE TRIGGER gantry_notify_job_upd AFTER UPDATE ON scheduler_job
       REFERENCING NEW TABLE AS new_rows FOR EACH STATEMENT EXECUTE FUNCTION gantry_notify_job();""",
    """
    CREATE OR REPLACE FUNCTION gantry_notify_allocation() RETURNS trigger AS $$
    BEGIN
      IF EXISTS (SELECT 1 FROM new_rows n JOIN old_rows o ON o.id = n.id
                 WHERE o.ended_at IS NULL AND n.ended_at IS NOT NULL) THEN
        PERFORM pg_notify('gantry_scheduler', 'allocation');
      END IF;
      RETURN NULL;
    END $$ LANGUAGE plpgsql;
    """,
    """CREATE TRIGGER gantry_notify_allocation AFTER UPDATE ON scheduler_allocation
       REFERENCING OLD TABLE AS old_rows NEW TABLE AS new_rows FOR EACH STATEMENT
       EXECUTE FUNCTION gantry_notify_allocation();""",
]
PG_BACKWARD = [
    "DROP TRIGGER IF EXISTS gantry_notify_allocation ON scheduler_allocation;",
    "DROP TRIGGER IF EXISTS gantry_notify_job_upd ON scheduler_job;",
    "DROP TRIGGER IF EXISTS gantry_notify_job_ins ON scheduler_job;",
    "DROP TRIGGER IF EXISTS gantry_device_shares_del ON scheduler_allocationdevice;",
    "DROP TRIGGER IF EXISTS gantry_device_shares_upd ON scheduler_allocationdevice;",
    "DROP TRIGGER IF EXISTS gantry_device_shares_ins ON scheduler_allocationdevice;",
    "DROP FUNCTION IF EXISTS gantry_notify_allocation();",
    "DROP FUNCTION IF EXISTS gantry_notify_job();",
    "DROP FUNCTION IF EXISTS gantry_device_shares();",
]
SQLITE_FORWARD = [
    """CREATE TRIGGER gantry_device_shares_ins AFTER INSERT ON scheduler_allocationdevice
       WHEN NOT NEW.released BEGIN
         UPDATE scheduler_gpudevice SET allocated_milli = allocated_milli + NEW.milli
         WHERE id = NEW.device_id;
       END;""",
    """CREATE TRIGGER gantry_device_shares_upd AFTER UPDATE ON scheduler_allocationdevice
       BEGIN
         UPDATE scheduler_gpudevice SET allocated_milli = allocated_milli - OLD.milli
         WHERE id = OLD.device_id AND NOT OLD.released;
         UPDATE scheduler_gpudevice SET allocated_milli = allocated_milli + NEW.milli
         WHERE id = NEW.device_id AND NOT NEW.released;
       END;""",
    """CREATE TRIGGER gantry_device_shares_del AFTER DELETE ON scheduler_allocationdevice
       WHEN NOT OLD.released BEGIN
         UPDATE scheduler_gpudevice SET allocated_milli = allocated_milli - OLD.milli
         WHERE id = OLD.device_id;
       END;""",
]
SQLITE_BACKWARD = [
    "DROP TRIGGER IF EXISTS gantry_device_shares_ins;",
    "DROP TRIGGER IF EXISTS gantry_device_shares_upd;",
    "DROP TRIGGER IF EXISTS gantry_device_shares_del;",
]


def _run(statements: dict[str, list[str]]):
    def run(apps, schema_editor):
        for sql in statements.get(schema_editor.connection.vendor, []):
            schema_editor.execute(sql)

    return run


class Migration(migrations.Migration):
    dependencies = [("scheduler", "0002_daemon_nodes_allocations")]

    operations = [
        migrations.RunPython(
            _run({"postgresql": PG_FORWARD, "sqlite": SQLITE_FORWARD}),
            _run({"postgresql": PG_BACKWARD, "sqlite": SQLITE_BACKWARD}),
        )
    ]
