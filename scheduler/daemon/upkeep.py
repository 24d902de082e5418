"""Database upkeep: ANALYZE the columns the daemon plans with when they changed a lot."""

from __future__ import annotations

import logging

from django.db import connection

from scheduler.daemon.state import Every
from scheduler.models import (
    Allocation,
    AllocationDevice,
    Job,
    JobState,
)

log = logging.getLogger("gantry.daemon")
S = JobState


# The tables the daemon plans against every cycle, and the columns its statements filter
# and join on: analysing these alone is much cheaper than whole tables (the jobs' JSON specs
# are most of an ANALYZE of their table; bench/history.md, kueue_e2e, 2026-12-03 11:11-14:10).
PLANNED_COLUMNS = {
    Job._meta.db_table: ("id", "state", "tenant_id", "priority_class_id", "queued_at"),
    Allocation._meta.db_table: ("id", "job_id", "node_id", "ended_at"),
    AllocationDevice._meta.db_table: ("id", "allocation_id", "device_id", "released"),
}


STATISTICS_EVERY_S = 10.0


class Statistics:
    """When the daemon last looked, and the change counts it analysed each table at."""

    def __init__(self) -> None:
        self.looked = Every(STATISTICS_EVERY_S)
        # table -> (changes counted, rows) when this daemon last analysed it
        self.analysed: dict[str, tuple[int, int]] = {}

    def refresh(self, now: float) -> list[str]:
        """ANALYZE, on PostgreSQL, the columns the daemon plans with (`PLANNED_COLUMNS`) of each
        table that changed by more rows than it held when last analysed (and by at least
        1,000); looked at every `STATISTICS_EVERY_S` on the daemon's clock. Autovacuum does the
        same after its naptime (a minute) and a tenth of the table: a new installation under
        load is planned blind until then, and the planner scans whole tables to update a
        hundred rows. An ANALYZE of some columns does not reset PostgreSQL's count of changes,
        so the daemon keeps the count it analysed at (`analysed`). Returns the tables
        analysed."""
        if connection.vendor != "postgresql" or not self.looked.due(now):
            return []
        stale = []
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT s.relname, s.n_mod_since_analyze, s.n_live_tup, c.reltuples"
                " FROM pg_stat_user_tables s JOIN pg_class c ON c.oid = s.relid"
                " WHERE s.relname = ANY(%s) ORDER BY s.relname",
                [list(PLANNED_COLUMNS)],
            )
            for table, changed, rows, reltuples in cursor.fetchall():
                changed_then, held = self.analysed.get(table, (0, max(0, int(reltuples))))
                if changed - changed_then <= max(1000, held):
                    continue  # also when autovacuum analysed it since (the count went down)
                columns = ", ".join(map(connection.ops.quote_name, PLANNED_COLUMNS[table]))
                cursor.execute(f"ANALYZE {connection.ops.quote_name(table)} ({columns})")
                self.analysed[table] = (changed, rows)
                stale.append(table)
        if stale:
            log.info("analysed %s", ", ".join(stale))
        return stale
