"""Fair share's memory: each tenant's decayed usage, carried across cycles and handed on to the
next leader with the lease."""

from __future__ import annotations

from typing import Any

from scheduler.core import decay_usage
from scheduler.core.types import Snapshot


class FairShare:
    def __init__(self) -> None:
        self.decayed: dict[str, float] = {}
        self._usage: dict[str, int] = {}  # tenant -> GPU milli running at the last snapshot
        self._at: float | None = None  # when (daemon clock) `decayed` was last brought up

    def state(self) -> dict[str, Any] | None:
        """What the lease saves with each renewal."""
        if self._at is None:
            return None
        return {"at": self._at, "decayed": self.decayed}

    def inherit(self, state: dict[str, Any]) -> None:
        """Start from the previous leader's decayed usage: a takeover or restart must not
        reset fair share. Its usage since its last save is unknown and counts as none."""
        if not state.get("decayed") or self._at is not None:
            return
        self.decayed = {str(k): float(v) for k, v in state["decayed"].items()}
        self._at, self._usage = float(state["at"]), {}

    def decay(self, now: float, half_life_s: float) -> dict[str, float]:
        """The decayed usage brought up to `now`, counting what ran since the last call."""
        if self._at is not None:
            elapsed = max(0.0, now - self._at)
            self.decayed = decay_usage(self.decayed, self._usage, elapsed, half_life_s)
        self._at = now
        return self.decayed

    def record(self, snapshot: Snapshot) -> None:
        """What runs now, counted until the next `decay`."""
        usage: dict[str, int] = {}
        for running in snapshot.running:
            usage[running.job.tenant] = usage.get(running.job.tenant, 0) + running.gpu_milli
        self._usage = usage
