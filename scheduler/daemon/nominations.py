"""The placements a cycle made that wait, handed to the next cycle as nominations.

A placement that relies on jobs preempted for it (or for others) is not written: its job
stays queued until the victims' pods are gone (`scheduler.daemon.apply`). The next cycle's
engine holds the room of such placements for their jobs (`Snapshot.nominated`, see
`scheduler.core.nomination`), so a victim back in the queue is not re-admitted into room it
would lose at once. Kept in memory by the leading daemon only: a new leader starts without
them, and at worst the first preemption after a failover is decided twice.
"""

from __future__ import annotations

from collections.abc import Iterable

from scheduler.core.types import CycleResult, Placement
from scheduler.daemon.translate import job_pk


def waiting_placements(
    result: CycleResult, pending_ids: Iterable[int], claimed: set[int]
) -> tuple[Placement, ...]:
    """The placements in ``result`` of jobs that were queued (``pending_ids``) and were not
    claimed in this cycle (``claimed``): they wait for stopping jobs, or lost a conflict."""
    pending = set(pending_ids)
    return tuple(
        p for p in result.placements if (pk := job_pk(p.job_id)) in pending and pk not in claimed
    )
