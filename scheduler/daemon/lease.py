"""Leadership as the cycle uses it: when to renew the lease, and the fence before every write
to the cluster. The lease itself (the row, its epoch, the database fence) is
`scheduler.leader.Lease`."""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from typing import Any

from scheduler.daemon.state import Clock
from scheduler.leader import Lease, LeaseLost


class LeaseKeeper:
    """Renewals on two clocks: the monotonic one (deadlines between phases: a stalled call or
    a paused process is always caught) and the daemon's (the renewal at a step's start, which
    tests drive). `state()` gives what to save with each renewal (the fair-share history)."""

    def __init__(
        self,
        lease: Lease,
        clock: Clock,
        state: Callable[[], dict[str, Any] | None],
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.lease, self.clock, self.state, self.monotonic = lease, clock, state, monotonic
        self._renewed = -math.inf  # monotonic
        self._step_renewed = -math.inf  # daemon clock
        self.lost = False  # a renewal found the lease gone: no thread sends another write

    def mark_renewed(self) -> None:
        """The lease was just taken or renewed."""
        self._renewed = self.monotonic()
        self._step_renewed = self.clock.now()
        self.lost = False

    def _renew(self, state: dict[str, Any] | None, why: str) -> None:
        if not self.lease.renew(state):
            self.lost = True
            raise LeaseLost(why)
        self.mark_renewed()

    def renew_due(self) -> bool:
        """Renewal at the start of a step: every sixth of the TTL on the daemon's clock, and
        whenever that clock went back."""
        elapsed = self.clock.now() - self._step_renewed
        return elapsed >= self.lease.ttl_s / 6 or elapsed < 0

    def renew_at_step(self) -> bool:
        """Renew at a step's start, saving the state; False when the lease was lost."""
        try:
            self._renew(self.state(), "lease lost at the step's start")
        except LeaseLost:
            return False
        return True

    def keep(self) -> None:
        """Between phases: renew once a third of the TTL has passed (monotonic clock; the
        lease's own times are the database's). LeaseLost when it was lost."""
        if self.monotonic() - self._renewed < self.lease.ttl_s / 3:
            return
        self._renew(self.state(), "lease lost during the cycle")

    def keep_for_threads(self) -> None:
        """While the daemon's threads send writes (`fence_from_thread`): renew once a sixth
        of the TTL has passed, so that a thread never finds it a third old. LeaseLost when
        it was lost, and every thread's next write is refused."""
        if self.monotonic() - self._renewed < self.lease.ttl_s / 6:
            return
        self._renew(None, "lease lost while writes were in flight")

    def fence_from_thread(self) -> None:
        """The fence of a write sent from one of the daemon's call threads, which touch no
        database: LeaseLost once the last renewal is a third of the TTL old (the cycle's
        thread renews every sixth while it waits, `keep_for_threads`), or was refused. A
        lease renewed a third of its TTL ago cannot have been taken by another daemon."""
        if self.lost or self.monotonic() - self._renewed >= self.lease.ttl_s / 3:
            raise LeaseLost("lease not renewed in time for a write to the cluster")

    def fence_cluster_write(self) -> None:
        """Before every write to the cluster (create, bind, delete, cordon): LeaseLost unless
        this daemon still leads. The cluster knows nothing of epochs, so a stale leader's
        write cannot be refused there: it must not be sent. The lease is renewed (a fenced
        UPDATE of its row) unless that was done less than a sixth of the TTL ago on both the
        monotonic and the daemon's clock, so a call that stalled (a hung API request, a
        paused process) is always followed by a check before the next write."""
        window = self.lease.ttl_s / 6
        since = self.clock.now() - self._step_renewed
        if 0 <= since < window and self.monotonic() - self._renewed < window:
            return
        self._renew(None, "lease lost before a write to the cluster")
