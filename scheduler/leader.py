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
"""

from __future__ import annotations

import socket
import uuid
from datetime import timedelta
from typing import Any

from django.db import connection, transaction
from django.db.models import DateTimeField, ExpressionWrapper, F, Q
from django.db.models.functions import Now

from scheduler.models import SchedulerLease

LEASE_NAME = "scheduler"


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
        with transaction.atomic():
            changed = SchedulerLease.objects.filter(takeable, name=self.name).update(
                holder=self.holder,
                epoch=F("epoch") + 1,
                renewed_at=Now(),
                expires_at=self._expiry(),
            )
            if not changed:
                self.epoch = None
                return False
            row = SchedulerLease.objects.get(name=self.name)
            self.epoch, self.inherited = row.epoch, dict(row.fair_share or {})
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

    def record_cycle(self, error: str | None = None) -> None:
        """Write how the last cycle went: None, it completed (the failures since are
        cleared); otherwise its error. Whoever holds the lease, by name: a failing daemon
        drops its lease with each failure and takes it again, so the row speaks for the
        scheduler, not for one epoch. Not fenced: it is a report, not a decision."""
        rows = SchedulerLease.objects.filter(name=self.name)
        if error is None:
            rows.update(cycle_ok_at=Now(), cycle_failures=0, cycle_error="")
        else:
            rows.update(
                cycle_failed_at=Now(),
                cycle_failures=F("cycle_failures") + 1,
                cycle_error=error[:500],
            )

    def fence(self) -> None:
        """Inside a transaction: raise LeaseLost unless our epoch still holds the lease."""
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
            self.epoch = None
            raise LeaseLost(f"epoch {stale} no longer holds the lease")
