"""The placements a cycle made that wait, handed to the next cycle as nominations.

A placement that relies on jobs preempted for it (or for others) is not written: its job
stays queued until the victims' pods are gone (`scheduler.daemon.apply`). The next cycle's
engine holds the room of such placements for their jobs (`Snapshot.nominated`, see
`scheduler.core.nomination`), so a victim back in the queue is not re-admitted into room it
would lose at once. Kept in memory by the leading daemon only: a new leader starts without
them, and at worst the first preemption after a failover is decided twice.

The engine takes a nomination's plan again while the victims it names still run
(`core.nomination.retake`): so it is handed on only while each of them that still holds
devices is really stopping (preempted); one the daemon could not preempt (its row was
locked) is left to a new search.
"""

from __future__ import annotations

from collections.abc import Iterable

from scheduler.core.types import CycleResult, Placement
from scheduler.models import JobState
from scheduler.snapshot.build import Built
from scheduler.snapshot.translate import job_pk


def waiting_placements(
    result: CycleResult, pending_ids: Iterable[int], claimed: set[int]
) -> tuple[Placement, ...]:
    """The placements in ``result`` of jobs that were queued (``pending_ids``) and were not
    claimed in this cycle (``claimed``): they wait for stopping jobs, or lost a conflict."""
    pending = set(pending_ids)
    return tuple(
        p for p in result.placements if (pk := job_pk(p.job_id)) in pending and pk not in claimed
    )


def still_waiting(nominated: Iterable[Placement], built: Built) -> tuple[Placement, ...]:
    """The nominations whose jobs are still queued and whose victims that still hold
    devices are all stopping, as ``built`` (this cycle's snapshot and rows) shows them."""
    pending = set(built.pending_ids)
    holding = {job_pk(r.job.id) for r in built.snapshot.running}
    return tuple(
        p
        for p in nominated
        if job_pk(p.job_id) in pending
        and all(
            pk not in holding or built.jobs[pk]["state"] == JobState.PREEMPTED
            for pk in map(job_pk, p.victims)
        )
    )
