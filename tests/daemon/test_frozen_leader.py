"""Issue 17, point 10: a leader frozen inside a write transaction (SIGSTOP) holds the lease
row's lock. Bounded two ways: the daemon's PostgreSQL sessions carry server-side timeouts
(the server ends a session idle in a transaction), and a takeover never waits on the row."""

from __future__ import annotations

from typing import Any

import pytest
from django.db import connection

from scheduler.daemon.loop import Daemon
from scheduler.leader import configure_session, session_settings
from scheduler.models import SchedulerLease
from tests.daemon.conftest import Env, expire_leases
from tests.daemon.test_faults import pg

pytestmark = pytest.mark.postgresql("server-side session timeouts and row locks")


def _show(name: str) -> str:
    with connection.cursor() as cursor:
        cursor.execute(f"SHOW {name}")
        return str(cursor.fetchone()[0])


def test_the_daemons_loop_runs_with_its_session_timeouts(env: Env, settings: Any) -> None:
    settings.GANTRY_DAEMON_IDLE_IN_TRANSACTION_TIMEOUT_MS = 4000
    settings.GANTRY_DAEMON_STATEMENT_TIMEOUT_MS = 12000
    settings.GANTRY_DAEMON_LOCK_TIMEOUT_MS = 1500
    seen: dict[str, str] = {}

    def look(daemon: Daemon) -> None:
        daemon.stop.set()  # first: the loop ends whatever this finds
        seen.update({name: _show(name) for name in session_settings()})

    daemon = env.daemon(on_cycle=look)
    daemon.run()
    assert seen == {
        "idle_in_transaction_session_timeout": "4s",
        "statement_timeout": "12s",
        "lock_timeout": "1500ms",
    }
    assert _show("lock_timeout") == "5s"  # the web's settings again once the loop ends


def test_a_leader_frozen_inside_its_write_is_cut_off_and_a_standby_takes_over(
    tenv: Env,
) -> None:
    """The leader's session, configured as the daemon's are (with a short idle timeout for
    the test), freezes inside a fenced write: the lease row stays locked FOR SHARE. The
    standby is refused at once while it is; the server ends the frozen session, which
    releases the lock, and the standby takes over."""
    leader = tenv.daemon("leader")
    assert leader.lease.acquire()
    expire_leases()  # the leader stops renewing: frozen
    standby = tenv.daemon("standby")
    frozen: Any = pg()
    try:
        short = {**session_settings(), "idle_in_transaction_session_timeout": 200}
        configure_session(frozen.cursor(), short)
        frozen.execute("BEGIN")
        frozen.execute("SELECT 1 FROM scheduler_schedulerlease FOR SHARE")  # then SIGSTOP
        assert standby.lease.acquire() is False  # refused at once, not after a lock wait
        # Wait for the lock the way a takeover UPDATE would, bounded by lock_timeout (5 s):
        # it is granted once the server has ended the frozen session.
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1 FROM scheduler_schedulerlease FOR UPDATE")
        assert standby.lease.acquire() is True
        assert SchedulerLease.objects.get().holder == "standby"
    finally:
        frozen.close()
