"""Database upkeep (`scheduler.daemon.upkeep`): ANALYZE of the tables the daemon plans with."""

from __future__ import annotations

import pytest
from django.db import connection

from scheduler.models import Job
from tests.daemon.conftest import Env
from tests.factories import row_columns


@pytest.mark.postgresql("ANALYZE and pg_stat counters")
def test_the_daemon_analyses_its_tables_once_they_outgrow_their_statistics(tenv: Env) -> None:
    """A table the daemon plans against that changed by more rows than it held at its last
    ANALYZE (and by 1,000) is analysed within `STATISTICS_EVERY_S`, not after autovacuum's
    naptime: a new installation under load was planned blind for its first minute."""
    from scheduler.daemon.upkeep import STATISTICS_EVERY_S

    def analysed(table: str) -> int:
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_stat_clear_snapshot()")
            cursor.execute(
                "SELECT analyze_count FROM pg_stat_user_tables WHERE relname = %s", [table]
            )
            return int(cursor.fetchone()[0])

    daemon = tenv.daemon()
    first = tenv.submit()
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE scheduler_job")
    before = analysed("scheduler_job")
    fields = row_columns(first)
    Job.objects.bulk_create([Job(**fields) for _ in range(1500)])
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_stat_force_next_flush()")  # counted once this one ends
    assert daemon.statistics.refresh(tenv.clock()) == ["scheduler_job"]
    assert analysed("scheduler_job") == before + 1
    tenv.clock.advance(STATISTICS_EVERY_S)
    assert daemon.statistics.refresh(tenv.clock()) == []  # current again
    Job.objects.bulk_create([Job(**fields) for _ in range(1200)])
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_stat_force_next_flush()")
    # looked at most every STATISTICS_EVERY_S
    assert daemon.statistics.refresh(tenv.clock()) == []
    tenv.clock.advance(STATISTICS_EVERY_S)
    assert (
        daemon.statistics.refresh(tenv.clock()) == []
    )  # 1,200 new rows: fewer than the 1,501 it held
