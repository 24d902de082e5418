"""The chaos benchmark's faults, each a blocking step that returns what it did.

The schedulers are found through the database: the lease row names the leader's holder, which
each `run_scheduler` prints when it starts, and each process connects with its own
`application_name` (PGAPPNAME), so its backends show in pg_stat_activity. The monitor's own
connection is plain psycopg in autocommit, reopened after PostgreSQL restarts.
"""

from __future__ import annotations

import re
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.chaos.env import Proc

HOLDER_LINE = re.compile(r"^scheduler (\S+) on the ", re.MULTILINE)

# Bench-only: a trigger on the run's own database that records every allocation written with
# an epoch older than the lease's at that moment. The fence holds the lease row FOR SHARE from
# its check to the commit, so a fenced write can never be stale; a row here is a daemon that
# wrote after losing its lease.
STALE_WRITE_SQL = """
CREATE TABLE chaos_stale_write (
    at timestamptz NOT NULL DEFAULT clock_timestamp(), row_epoch bigint, lease_epoch bigint,
    app text);
CREATE FUNCTION chaos_check_epoch() RETURNS trigger AS $$
DECLARE current bigint;
BEGIN
    SELECT epoch INTO current FROM scheduler_schedulerlease WHERE name = 'scheduler';
    IF NEW.epoch < current THEN
        INSERT INTO chaos_stale_write (row_epoch, lease_epoch, app)
        VALUES (NEW.epoch, current, current_setting('application_name'));
    END IF;
    RETURN NEW;
END $$ LANGUAGE plpgsql;
CREATE TRIGGER chaos_check_epoch BEFORE INSERT ON scheduler_allocation
    FOR EACH ROW EXECUTE FUNCTION chaos_check_epoch();
"""


@dataclass
class Monitor:
    """SQL against the run's database that survives its restarts."""

    url: str
    connection: Any = None

    def query(self, sql: str, params: Any = None) -> list[tuple[Any, ...]]:
        return self._run(sql, params, fetch=True)

    def execute(self, sql: str) -> None:
        self._run(sql, None, fetch=False)

    def _run(self, sql: str, params: Any, *, fetch: bool) -> list[tuple[Any, ...]]:
        import psycopg

        for _ in range(60):
            try:
                if self.connection is None or self.connection.closed:
                    self.connection = psycopg.connect(self.url, autocommit=True, connect_timeout=3)
                cursor = self.connection.execute(sql, params)
                return cursor.fetchall() if fetch else []
            except psycopg.OperationalError:
                self.connection = None
                time.sleep(0.5)
        raise RuntimeError(f"the run's database did not answer: {sql[:60]}")

    def leader(self) -> tuple[str, int] | None:
        rows = self.query(
            "SELECT holder, epoch FROM scheduler_schedulerlease"
            " WHERE name = 'scheduler' AND expires_at > clock_timestamp()"
        )
        return (rows[0][0], rows[0][1]) if rows else None


@dataclass
class Schedulers:
    """The scheduler processes, leader and standbys; `start()` makes a new one."""

    make: Callable[[int], Proc]
    monitor: Monitor
    procs: list[Proc] = field(default_factory=list)
    started: int = 0

    def start(self) -> Proc:
        self.started += 1
        proc = self.make(self.started).start()
        self.procs.append(proc)
        return proc

    def alive(self) -> list[Proc]:
        return [p for p in self.procs if p.alive()]

    def holder(self, proc: Proc) -> str | None:
        found = HOLDER_LINE.search(proc.log.read_text(errors="replace"))
        return found.group(1) if found else None

    def leader(self, wait_s: float = 60.0) -> tuple[Proc, int] | None:
        """The live process that holds the lease now (and its epoch), waiting for one."""
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline:
            lease = self.monitor.leader()
            if lease is not None:
                for proc in self.alive():
                    if self.holder(proc) == lease[0]:
                        return proc, lease[1]
            time.sleep(0.2)
        return None

    def wait_takeover(self, old: Proc, wait_s: float) -> bool:
        """True once another process than `old` holds the lease."""
        mine = self.holder(old)
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline:
            lease = self.monitor.leader()
            if lease is not None and lease[0] != mine:
                return True
            time.sleep(0.2)
        return False


def kill_leader(schedulers: Schedulers) -> bool:
    """SIGKILL the leader and start a new standby."""
    found = schedulers.leader()
    if found is None:
        return False
    found[0].signal(signal.SIGKILL)
    found[0].process.wait(timeout=30)
    schedulers.start()
    return True


# A frozen process's backends, as pg_stat_activity shows them: between cycles every one is
# idle; inside a write transaction one holds a transaction id.
FROZEN_WHERE = {
    False: "bool_and(state = 'idle')",
    True: "bool_or(backend_xid IS NOT NULL)",
}


def holds_file_lock(pid: int, path: Path) -> bool:
    """Whether `pid` holds the flock of `path` (/proc/locks: the simulated cluster's state
    lock). A process frozen holding it would stall every other user of the simulated
    cluster, which a real cluster's API server does not do; such a moment is not used."""
    try:
        inode = path.stat().st_ino
    except FileNotFoundError:
        return False
    for line in Path("/proc/locks").read_text().splitlines():
        fields = line.split()
        if "->" in fields or len(fields) < 6:
            continue
        if fields[4] == str(pid) and fields[5].rsplit(":", 1)[-1] == str(inode):
            return True
    return False


def freeze_leader(
    schedulers: Schedulers, *, in_write: bool, wait_s: float, cluster_lock: Path
) -> dict[str, Any]:
    """SIGSTOP the leader (between cycles: its sessions idle; or inside a write transaction:
    a backend of it holding a transaction id) until another process leads, then SIGCONT it.
    The moment is checked once the process is stopped; a wrong one is resumed and tried
    again. Returns what happened, with the epoch it held."""
    found = schedulers.leader()
    if found is None:
        return {"done": False}
    proc, epoch = found
    sql = (
        f"SELECT coalesce({FROZEN_WHERE[in_write]}, false) FROM pg_stat_activity"  # noqa: S608
        " WHERE application_name = %s"
    )
    deadline = time.monotonic() + wait_s
    tries = 0
    while True:
        if time.monotonic() > deadline or not proc.alive():
            return {"done": False, "epoch": epoch, "tries": tries}
        tries += 1
        proc.signal(signal.SIGSTOP)
        right = schedulers.monitor.query(sql, [proc.env["PGAPPNAME"]])[0][0]
        if right and not holds_file_lock(proc.pid, cluster_lock):
            break
        proc.signal(signal.SIGCONT)
        time.sleep(0.005 if in_write else 0.2)
    frozen_at = time.monotonic()
    took_over = schedulers.wait_takeover(proc, wait_s)
    time.sleep(2.0)  # well past its lease: the new leader has cycled
    proc.signal(signal.SIGCONT)
    return {
        "done": True,
        "epoch": epoch,
        "taken_over": took_over,
        "frozen_s": round(time.monotonic() - frozen_at, 1),
        "tries": tries,
        "process": proc.name,
    }


def restart_schedulers(schedulers: Schedulers, monitor: Monitor, settle_s: float) -> dict[str, Any]:
    """Stop every scheduler process and start two new ones. The jobs running before must
    survive: the same attempt, still running or finished normally once a new leader cycled."""
    since = monitor.query("SELECT clock_timestamp()")[0][0]
    before = dict(monitor.query("SELECT id, attempt FROM scheduler_job WHERE state = 'running'"))
    for proc in schedulers.alive():
        proc.stop(grace_s=20.0)
    schedulers.start()
    schedulers.start()
    schedulers.leader()
    time.sleep(settle_s)
    after = {
        job: (state, attempt)
        for job, state, attempt in monitor.query(
            "SELECT id, state, attempt FROM scheduler_job WHERE id = ANY(%s)", [list(before)]
        )
    }
    preempted = {
        row[0]
        for row in monitor.query(
            "SELECT DISTINCT job_id FROM scheduler_jobevent"
            " WHERE job_id = ANY(%s) AND to_state = 'preempted' AND at > %s",
            [list(before), since],
        )
    }
    lost = [
        job
        for job, attempt in before.items()
        if job not in preempted
        and (
            after.get(job, ("gone", -1))[1] != attempt
            or after[job][0] not in ("running", "succeeded")
        )
    ]
    return {"running_before": len(before), "restart_lost_running": len(lost), "lost_ids": lost[:20]}
