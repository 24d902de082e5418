"""Leadership of the scheduler daemon: one lease row, the database's clock, a rising epoch.

- `acquire()` takes the lease when it is free, expired, or already ours, and raises the epoch
  every time: whatever an earlier holder (or an earlier life of this process) still has in
  flight carries an older epoch and is rejected.
- `renew()` pushes `expires_at` forward only while the epoch is still ours and unexpired.
- `fence()` runs inside each write transaction of the daemon: it reads the lease row FOR
  SHARE with our epoch and an unexpired time, or raises LeaseLost. The share lock makes a
  takeover (an UPDATE of that row) wait for our commit, so a write either commits while we
  lead or fails and changes nothing.

All times are the database's (`STATEMENT_TIMESTAMP()` / `clock_timestamp()`), never the
daemon's, so clock skew between hosts cannot give two leaders.

A leader frozen inside a fenced write (SIGSTOP, a hung host) would hold the share lock for as
long as it is frozen, and a takeover UPDATE would wait on it. Two bounds: `acquire()` never
waits on the row (NOWAIT: a locked row is "not now", tried again at the next poll), and the
daemon's own PostgreSQL sessions carry server-side timeouts (`daemon_sessions`), so the
server ends a session left idle in a transaction, releasing its locks.
"""

from __future__ import annotations

import contextlib
import socket
import uuid
from collections.abc import Iterator, Mapping
from datetime import timedelta
from typing import Any

from django.conf import settings
from django.db import DatabaseError, connection, transaction
from django.db.backends.signals import connection_created
from django.db.models import DateTimeField, ExpressionWrapper, F, Q
from django.db.models.functions import Now

from scheduler.models import SchedulerLease

LEASE_NAME = "scheduler"
LOCK_NOT_AVAILABLE = "55P03"  # PostgreSQL's SQLSTATE for NOWAIT on a locked row


class LeaseLost(Exception):
    """This daemon no longer leads: its epoch is stale or its lease expired."""


def default_holder() -> str:
    return f"{socket.gethostname()}-{uuid.uuid4().hex[:8]}"


class Lease:
    def __init__(self, holder: str | None = None, ttl_s: float = 6.0, name: str = LEASE_NAME):
        self.holder = holder or default_holder()
        self.ttl_s = ttl_s
        self.name = name
        self.epoch: int | None = None
        # What the previous leader saved (see `renew(state=...)`), read when acquiring.
        self.inherited: dict[str, Any] = {}

    @property
    def leading(self) -> bool:
        return self.epoch is not None

    def _expiry(self) -> ExpressionWrapper:
        return ExpressionWrapper(
            Now() + timedelta(seconds=self.ttl_s), output_field=DateTimeField()
        )

    def acquire(self) -> bool:
        """Take (or re-take) the lease with a new epoch. True when we lead afterwards."""
        SchedulerLease.objects.get_or_create(name=self.name)
        takeable = Q(expires_at__isnull=True) | Q(expires_at__lt=Now()) | Q(holder=self.holder)
        self.epoch = None
        try:
            with transaction.atomic():
                # Not waiting on the row: a leader's write in flight holds it FOR SHARE
                # (and a frozen one would hold it for as long as it is frozen).
                list(
                    SchedulerLease.objects.select_for_update(nowait=True)
                    .filter(name=self.name)
                    .values_list("pk")
                )
                changed = SchedulerLease.objects.filter(takeable, name=self.name).update(
                    holder=self.holder,
                    epoch=F("epoch") + 1,
                    renewed_at=Now(),
                    expires_at=self._expiry(),
                )
                if not changed:
                    return False
                row = SchedulerLease.objects.get(name=self.name)
                self.epoch, self.inherited = row.epoch, dict(row.fair_share or {})
        except DatabaseError as error:
            if getattr(error.__cause__, "sqlstate", None) == LOCK_NOT_AVAILABLE:
                return False
            raise
        return True

    def renew(self, state: dict[str, Any] | None = None) -> bool:
        """Extend our lease (saving `state` with it, fenced like any write); False (and no
        longer leading) when it was lost."""
        if self.epoch is None:
            return False
        extra = {"fair_share": state} if state is not None else {}
        changed = SchedulerLease.objects.filter(
            name=self.name, holder=self.holder, epoch=self.epoch, expires_at__gt=Now()
        ).update(renewed_at=Now(), expires_at=self._expiry(), **extra)
        if not changed:
            self.epoch = None
        return bool(changed)

    def release(self) -> None:
        """Step down now (graceful shutdown), so a standby need not wait for expiry."""
        if self.epoch is not None:
            SchedulerLease.objects.filter(
                name=self.name, holder=self.holder, epoch=self.epoch
            ).update(expires_at=Now())
        self.epoch = None

    def drop(self) -> None:
        """Forget leadership locally (after a database error); `acquire` takes a new epoch."""
        self.epoch = None

    def record_cycle(self, error: str | None = None, *, clear: bool = True) -> None:
        """Write how the last cycle went: None, it completed (with ``clear``, the failures
        counted so far are cleared; without, they stand); otherwise its error. Whoever holds
        the lease, by name: a failing daemon drops its lease with each failure and takes it
        again, so the row speaks for the scheduler, not for one epoch. Not fenced: it is a
        report, not a decision."""
        rows = SchedulerLease.objects.filter(name=self.name)
        if error is None and clear:
            rows.update(cycle_ok_at=Now(), cycle_failures=0, cycle_error="")
        elif error is None:
            rows.update(cycle_ok_at=Now())
        else:
            rows.update(
                cycle_failed_at=Now(),
                cycle_failures=F("cycle_failures") + 1,
                cycle_error=error[:500],
            )

    @contextlib.contextmanager
    def writing(self) -> Iterator[None]:
        """A write transaction under the lease, fenced last: the writes, then `fence()` just
        before the commit. The lease row is held FOR SHARE only for the commit, so no
        takeover can come between the fence and the commit (a write lands under the epoch
        that made it or not at all), and a leader stopped in the middle of its writes does
        not keep a standby out: a session waiting for the rows of a COPY from a stopped
        client is not idle, and no server timeout ends it (docs/daemon.md, "Leadership and
        fencing")."""
        if self.epoch is None:
            raise LeaseLost("not leading")
        with transaction.atomic():
            yield
            self.fence()

    def fence(self, *, forget: bool = True) -> None:
        """Inside a transaction: raise LeaseLost unless our epoch still holds the lease; and
        then forget the epoch, unless `forget` is False (a thread beside the loop: the loop
        finds out at its own next fence)."""
        if self.epoch is None:
            raise LeaseLost("not leading")
        if connection.vendor == "postgresql":
            sql = (
                "SELECT 1 FROM scheduler_schedulerlease WHERE name = %s AND holder = %s"
                " AND epoch = %s AND expires_at > clock_timestamp() FOR SHARE"
            )
            with connection.cursor() as cursor:
                cursor.execute(sql, [self.name, self.holder, self.epoch])
                ok = cursor.fetchone() is not None
        else:  # SQLite: IMMEDIATE transactions already serialise writers
            ok = SchedulerLease.objects.filter(
                name=self.name, holder=self.holder, epoch=self.epoch, expires_at__gt=Now()
            ).exists()
        if not ok:
            stale = self.epoch
            if forget:
                self.epoch = None
            raise LeaseLost(f"epoch {stale} no longer holds the lease")


def session_settings() -> dict[str, int]:
    """The server-side timeouts of the daemon's PostgreSQL sessions, in milliseconds
    (settings GANTRY_DAEMON_*_TIMEOUT_MS). Shorter than the web's: the daemon's statements
    are short and it never waits for a person inside a transaction."""
    idle = settings.GANTRY_DAEMON_IDLE_IN_TRANSACTION_TIMEOUT_MS
    return {
        "idle_in_transaction_session_timeout": idle,
        "statement_timeout": settings.GANTRY_DAEMON_STATEMENT_TIMEOUT_MS,
        "lock_timeout": settings.GANTRY_DAEMON_LOCK_TIMEOUT_MS,
    }


# How the daemon's sessions plan their prepared statements: PostgreSQL's own choice, a
# generic plan once five plans for the values were no cheaper (the web's sessions plan every
# execution for its values, config/settings.py). The daemon runs the same few statements
# every cycle, and planned them again at every execution for nothing; those that read
# through a partial index by state or kind name it in their text (`scheduler.snapshot.queue`,
# `scheduler.snapshot.build`), and those that pass a state as a value keep plans for their
# values once the table holds a history, where a generic plan (a scan) costs more
# (`Statistics` analyses the job table's columns as it grows, and a generic plan chosen
# while it was small is then weighed again; tests/daemon/test_plans.py).
DAEMON_PLAN_CACHE_MODE = "auto"


def configure_session(cursor: Any, values: Mapping[str, int] | None = None) -> None:
    """SET the daemon's timeouts (`session_settings()`, or `values`) and its plan cache mode
    (`DAEMON_PLAN_CACHE_MODE`) on one session."""
    for name, milliseconds in (values or session_settings()).items():
        cursor.execute(f"SET {name} = {int(milliseconds)}")
    cursor.execute(f"SET plan_cache_mode = {DAEMON_PLAN_CACHE_MODE}")


def _configure_new(sender: Any, connection: Any, **kwargs: Any) -> None:
    if connection.vendor == "postgresql" and connection.alias == "default":
        with connection.cursor() as cursor:
            configure_session(cursor)


def daemon_sessions_for_life() -> None:
    """As `daemon_sessions`, in a process that is the daemon's for its whole life (the queue
    estimates' worker, `scheduler.estimates.worker`): every PostgreSQL session it opens from now
    on carries the daemon's timeouts."""
    connection_created.connect(_configure_new, dispatch_uid="gantry-daemon-sessions")


@contextlib.contextmanager
def daemon_sessions() -> Iterator[None]:
    """While the daemon's loop runs, every PostgreSQL session of this process carries the
    daemon's timeouts: the one open now and each one opened after a reconnect. A no-op on
    SQLite, whose writers serialise on the database file instead of on row locks."""
    if connection.vendor != "postgresql":
        yield
        return
    connection_created.connect(_configure_new, dispatch_uid="gantry-daemon-sessions")
    try:
        if connection.connection is not None:
            with connection.cursor() as cursor:
                configure_session(cursor)
        yield
    finally:
        connection_created.disconnect(dispatch_uid="gantry-daemon-sessions")
        with contextlib.suppress(DatabaseError):
            if connection.connection is not None:
                with connection.cursor() as cursor:
                    for name in [*session_settings(), "plan_cache_mode"]:
                        cursor.execute(f"RESET {name}")
