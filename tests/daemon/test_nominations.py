"""Which placements the daemon hands on as nominations, and which it lets lapse: the engine
takes a nomination's plan again while its victims still run, so a victim the daemon could
not preempt (its row was locked) must not be waited for."""

from __future__ import annotations

import pytest

from scheduler.core.types import Placement, RunningJob, Snapshot
from scheduler.daemon.nominations import still_waiting
from scheduler.snapshot.build import Built
from tests.scheduler.core.builders import CLASSES, make_job, make_node, make_running

ROOM = make_running(make_job("2"), ("n1", [0])).assignments


def built(victim_state: str | None, pending: tuple[int, ...] = (2,)) -> Built:
    """Job 2 queued; job 1, its victim, holding devices in `victim_state` (None: gone)."""
    running: tuple[RunningJob, ...] = ()
    jobs = {2: {"state": "queued"}}
    if victim_state is not None:
        running = (make_running(make_job("1"), ("n1", [0])),)
        jobs[1] = {"state": victim_state}
    snap = Snapshot(0.0, (make_node("n1"),), (), CLASSES, running, ())
    return Built(snap, jobs, list(pending), {}, {})


@pytest.mark.parametrize(
    ("victim", "pending", "kept"),
    [
        ("preempted", (2,), True),  # its pods are going: the plan is taken again
        (None, (2,), True),  # gone: the room is held for job 2 this cycle
        ("running", (2,), False),  # not preempted after all: a new search
        ("preempted", (), False),  # job 2 left the queue (placed, cancelled)
    ],
    ids=["victim-stopping", "victim-gone", "victim-not-preempted", "job-not-queued"],
)
def test_a_nomination_is_handed_on_while_its_victims_stop(
    victim: str | None, pending: tuple[int, ...], kept: bool
) -> None:
    nomination = Placement("2", "H100", ROOM, victims=("1",))
    assert still_waiting((nomination,), built(victim, pending)) == ((nomination,) if kept else ())
