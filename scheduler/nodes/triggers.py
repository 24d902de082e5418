"""The SQLite triggers that keep `GpuDevice.allocated_milli` equal to the live device shares.

On PostgreSQL the triggers (migration 0003) survive schema changes. On SQLite, Django alters a
column by building a new table and dropping the old one, and a table's triggers go with it:
migration 0008 did exactly that to `scheduler_allocationdevice`, after which every device read
0 milli and the CHECK that refuses over-allocation never fired. So the triggers are installed
by `ensure_sqlite_triggers`, which migration 0009 and every `migrate` (the `post_migrate`
signal) call: a later table rebuild cannot lose them silently.
"""

from __future__ import annotations

from typing import Any

from common.db.sqlite_triggers import install_missing

TRIGGERS = {
    "gantry_device_shares_ins": """
        CREATE TRIGGER gantry_device_shares_ins AFTER INSERT ON scheduler_allocationdevice
        WHEN NOT NEW.released BEGIN
          UPDATE scheduler_gpudevice SET allocated_milli = allocated_milli + NEW.milli
          WHERE id = NEW.device_id;
        END;""",
    "gantry_device_shares_upd": """
        CREATE TRIGGER gantry_device_shares_upd AFTER UPDATE ON scheduler_allocationdevice
        BEGIN
          UPDATE scheduler_gpudevice SET allocated_milli = allocated_milli - OLD.milli
          WHERE id = OLD.device_id AND NOT OLD.released;
          UPDATE scheduler_gpudevice SET allocated_milli = allocated_milli + NEW.milli
          WHERE id = NEW.device_id AND NOT NEW.released;
        END;""",
    "gantry_device_shares_del": """
        CREATE TRIGGER gantry_device_shares_del AFTER DELETE ON scheduler_allocationdevice
        WHEN NOT OLD.released BEGIN
          UPDATE scheduler_gpudevice SET allocated_milli = allocated_milli - OLD.milli
          WHERE id = OLD.device_id;
        END;""",
}

# The counters recomputed from the live shares: what the triggers would have kept.
RECOUNT = """
    UPDATE scheduler_gpudevice SET allocated_milli = COALESCE(
      (SELECT sum(s.milli) FROM scheduler_allocationdevice s
       WHERE s.device_id = scheduler_gpudevice.id AND NOT s.released), 0)"""


def ensure_sqlite_triggers(connection: Any) -> list[str]:
    """Install the device-share triggers that are missing on a SQLite database and, when any
    was, recount every device from its live shares (writes made without the trigger left the
    counters wrong). Returns the names installed; a no-op on other databases."""
    tables = ["scheduler_allocationdevice", "scheduler_gpudevice"]
    missing = install_missing(connection, tables, TRIGGERS)
    if missing:
        with connection.cursor() as cursor:
            cursor.execute(RECOUNT)
    return missing
