"""No preemption livelock (issue 35): the room a preemptor's victims free is held for it
(``Snapshot.nominated``, ``core.nomination``) until its turn.

``replay`` runs cycles under the daemon's contract, not the simulator's: a placement that
relies on stopping jobs is not started but waits (its job stays queued), victims stop a
cycle later and return to the queue, and each cycle is told the placements of the cycle
before that still wait. The simulator (``scheduler.sim``) starts placements at once, so it
never shows the livelock.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field, replace

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from scheduler.core import Profile, run_cycle
from scheduler.core.types import JobRequest, Node, Placement, RunningJob, Snapshot, Tenant
from tests.scheduler.core.builders import (
    CLASSES,
    make_job,
    make_node,
    make_running,
    make_tenants,
    snapshot,
)

pytestmark = pytest.mark.backend_independent(
    "the pure engine (import-linter): no database, cache or broker"
)

PROFILE = Profile(min_runtime_s=300.0)


@dataclass
class Replay:
    """What the daemon would have done: preemptions per victim, and what runs at the end."""

    nodes: list[Node]
    tenants: tuple[Tenant, ...]
    running: dict[str, RunningJob]
    pending: dict[str, JobRequest]
    stop_cycles: int = 1  # how many cycles later a victim's pods are gone
    preempted: Counter[str] = field(default_factory=Counter)

    def run(self, cycles: int, now: float = 10_000.0) -> None:
        stopping: dict[str, int] = {}  # victim -> cycles until its pods are gone
        nominated: tuple[Placement, ...] = ()
        for _ in range(cycles):
            now += 2.0
            for job_id, left in list(stopping.items()):
                if left > 1:
                    stopping[job_id] = left - 1
                    continue
                del stopping[job_id]  # its pods are gone: back to the queue
                job = self.running.pop(job_id).job
                self.pending[job_id] = replace(job, attempt=job.attempt + 1)
            snap = Snapshot(
                now,
                tuple(self.nodes),
                self.tenants,
                CLASSES,
                tuple(self.running.values()),
                tuple(self.pending.values()),
                nominated=nominated,
            )
            result = run_cycle(snap, PROFILE)
            for stop in result.preemptions:
                if stop.job_id in self.running and stop.job_id not in stopping:
                    stopping[stop.job_id] = self.stop_cycles
                    self.preempted[stop.job_id] += 1
            held = {
                (a.node, s.device)
                for v in stopping
                for a in self.running[v].assignments
                for s in a.shares
            }
            # Pods bound a cycle ago start; a victim stopping counts as started too, as the
            # daemon reads it (preempted is neither admitted nor binding).
            for job_id, r in list(self.running.items()):
                if not r.started:
                    self.running[job_id] = replace(r, started=True, started_at=now)
            waiting: list[Placement] = []
            for p in result.placements:
                uses = {(a.node, s.device) for a in p.assignments for s in a.shares}
                if p.job_id not in self.pending:
                    continue
                if p.victims or uses & held:  # bound once the victims are gone
                    waiting.append(p)
                    continue
                job = self.pending.pop(p.job_id)
                self.running[job.id] = RunningJob(
                    job, p.flavor, p.assignments, now, displaced=p.victims, started=False
                )
            nominated = tuple(waiting)


def after_failure() -> Replay:
    """Two nodes left after a failure; guarantees of 20 for 16 GPUs. vision runs 8 on 4
    guaranteed; search runs 8 of 12 and queues an 8-GPU gang (borrowing, its queue's head)
    and a 4-GPU job within its guarantee, which reclaims vision's job. With vision's job
    back in the queue, vision's head ranks before search's (both borrow, vision's share is
    lower): without a hold, it takes the room back, and is reclaimed again at once."""
    tenants = make_tenants(("nlp", 4, None), ("vision", 4, 24), ("search", 12, 24))
    gang = make_job("search-gang", "search", 4, replicas=2, priority="high")
    vision = make_job("vision-8", "vision", 8, priority="high")
    return Replay(
        [make_node("n1"), make_node("n2")],
        tenants,
        {
            gang.id: make_running(gang, ("n1", range(4)), ("n1", range(4, 8))),
            vision.id: make_running(vision, ("n2", range(8))),
        },
        {
            "search-queued": make_job("search-queued", "search", 4, replicas=2, submitted_at=5),
            "search-4": make_job("search-4", "search", 4, submitted_at=6),
        },
    )


@pytest.mark.parametrize("stop_cycles", [1, 3], ids=["pods-gone-next-cycle", "pods-take-3"])
def test_the_room_a_reclaim_frees_is_held_for_the_job_that_reclaimed_it(stop_cycles: int) -> None:
    replay = replace(after_failure(), stop_cycles=stop_cycles)
    replay.run(cycles=12)
    # 4 GPUs reclaimed from vision's 8: one preemption; on bf40e3b, 5 in 10 cycles (every
    # other cycle vision's job was admitted again and reclaimed again). When the victim's
    # pods take 3 cycles, its preemptor keeps its plan meanwhile (the victim, started a
    # cycle ago, is inside its minimum runtime): without that the plan and the hold lapsed.
    assert replay.preempted == Counter({"vision-8": 1})
    assert "search-4" in replay.running and "vision-8" in replay.pending


def test_a_victim_back_in_the_queue_is_not_admitted_into_the_held_room() -> None:
    # The cycle the victim's pods are gone: it ranks first, but the room is nominated.
    room = Placement("b", "H100", make_running(make_job("b"), ("n1", [0, 1, 2, 3])).assignments)
    snap = snapshot(
        [make_node("n1", gpus=4)],
        [make_job("a", gpus=4, priority="high"), make_job("b", gpus=4, priority="low")],
    )
    plain = run_cycle(snap, PROFILE)
    held = run_cycle(replace(snap, nominated=(room,)), PROFILE)
    assert plain.placement_for("a") is not None and plain.placement_for("b") is None
    assert held.placement_for("a") is None
    placed = held.placement_for("b")
    assert placed is not None and placed.assignments == room.assignments


def test_a_nomination_holds_only_what_is_free_and_only_for_a_job_still_waiting() -> None:
    # Devices 0-3 are still held by the stopping victim: only 4-7 are held for "b" (a 4-GPU
    # job fits there without it); a nomination of a job no longer queued holds nothing.
    victim = make_running(make_job("v", gpus=4, priority="high"), ("n1", [0, 1, 2, 3]))
    room = make_running(make_job("b"), ("n1", range(8))).assignments
    snap = snapshot(
        [make_node("n1")],
        [make_job("a", gpus=4, priority="high"), make_job("b", gpus=8, priority="low")],
        [victim],
    )
    result = run_cycle(replace(snap, nominated=(Placement("b", "H100", room),)), PROFILE)
    assert result.placement_for("a") is None and not result.preemptions
    gone = run_cycle(replace(snap, nominated=(Placement("c", "H100", room),)), PROFILE)
    assert gone.placement_for("a") is not None


TEAMS = ("nlp", "vision", "search")


@st.composite
def failed_clusters(draw: st.DrawFn) -> Replay:
    """A random cluster run by the engine, one of its nodes then failed (its jobs queued
    again), and a random queue: guarantees that may exceed what is left, borrowing teams,
    gangs and heads of queues that borrow."""
    count = draw(st.integers(2, 4))
    nodes = [make_node(f"n{i}") for i in range(count)]
    tenants = make_tenants(
        *[
            (t, draw(st.sampled_from([4, 8, 12])), draw(st.sampled_from([16, 24, None])))
            for t in TEAMS
        ]
    )
    jobs = []
    for i in range(draw(st.integers(3, 12))):
        replicas, gpus = draw(st.sampled_from([(2, 4), (1, 8), (1, 1), (1, 2), (1, 4)]))
        jobs.append(
            make_job(
                f"j{i}",
                draw(st.sampled_from(TEAMS)),
                gpus,
                replicas=replicas,
                priority=draw(st.sampled_from(["low", "normal", "normal", "high"])),
                submitted_at=float(i),
            )
        )
    first = run_cycle(snapshot(nodes, jobs, tenants=tenants, now=0.0), PROFILE)
    by_id = {j.id: j for j in jobs}
    running = {
        p.job_id: RunningJob(by_id[p.job_id], p.flavor, p.assignments, 0.0)
        for p in first.placements
    }
    dead = draw(st.sampled_from([n.name for n in nodes]))
    pending = {j.id: j for j in jobs if j.id not in running}
    for job_id, r in list(running.items()):
        if any(a.node == dead for a in r.assignments):
            del running[job_id]
            pending[job_id] = replace(r.job, attempt=1)
    stop_cycles = draw(st.integers(1, 3))
    return Replay([n for n in nodes if n.name != dead], tenants, running, pending, stop_cycles)


# derandomize: the same 400 clusters in every run, so that the suite is stable; a random
# search (without derandomize) found the loop of the test below.
@settings(
    max_examples=400,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow],
)
@given(failed_clusters())
def test_after_a_node_failure_no_job_is_preempted_twice(replay: Replay) -> None:
    # 30 cycles, a minute: within the minimum runtime, and each victim's first preemption
    # ends its claim to the room. Without nominations (bf40e3b), random clusters of this
    # kind find jobs preempted every other cycle; without `retake`, 400 examples found a
    # job preempted 10 times (120 did not).
    replay.run(cycles=30)
    assert max(replay.preempted.values(), default=0) <= 1, replay.preempted


def test_a_job_requeued_elsewhere_is_not_reclaimed_again() -> None:
    # Found by the property above with a random seed. vision's j5 reclaims nlp's j4 on n0;
    # j4, back in the queue, is placed on n2's free devices in the cycle that j5 takes its
    # held room, and j5's nomination still named j4 as the victim it waits for: j4, placed
    # that very cycle, was preempted again, every other cycle (15 times in 30). A victim
    # placed again this cycle is a new run, not the one being stopped.
    tenants = make_tenants(("nlp", 4, 16), ("vision", 8, 16), ("search", 4, 16))
    running = [
        make_running(make_job("j4", "nlp", 2, submitted_at=4), ("n0", [0, 1])),
        make_running(make_job("j2", "vision", 1, priority="low", submitted_at=2), ("n0", [2])),
        make_running(make_job("j3", "vision", 4, priority="low", submitted_at=3), ("n2", range(4))),
    ]
    pending = [
        make_job("j0", "nlp", 4, replicas=2, priority="low", submitted_at=0),
        make_job("j5", "vision", 2, priority="low", submitted_at=5),
        replace(make_job("j1", "vision", 4, replicas=2, priority="low", submitted_at=1), attempt=1),
    ]
    replay = Replay(
        [make_node("n0"), make_node("n2")],
        tenants,
        {r.job.id: r for r in running},
        {j.id: j for j in pending},
        stop_cycles=1,
    )
    replay.run(cycles=30)
    assert max(replay.preempted.values(), default=0) <= 1, replay.preempted


def test_a_preemptor_keeps_its_plan_while_a_victim_admitted_a_cycle_ago_stops() -> None:
    # nlp borrows a free node (8 GPUs on 4 guaranteed) for nlp-6; the next cycle vision's
    # 1-GPU job, within its guarantee, reclaims it before it started. Its pods take 3 cycles
    # to go: meanwhile nlp-6 counts as started and inside its minimum runtime, so a new
    # search finds no victim, the plan and its hold lapsed, and when the node was free nlp-6
    # (first in order) took it again: reclaimed every 4 cycles (3 times in 12).
    tenants = make_tenants(("nlp", 4, None), ("vision", 8, 16), ("search", 4, 24))
    on_n0 = [
        (make_job("vision-3", "vision", 4, priority="high", submitted_at=3), [0, 1, 2, 3]),
        (make_job("search-8", "search", 1, priority="high", submitted_at=8), [4]),
        (make_job("vision-4", "vision", 1, priority="high", submitted_at=4), [5]),
        (make_job("vision-5", "vision", 2, submitted_at=5), [6, 7]),
    ]
    queue = [
        make_job("vision-0", "vision", 4, replicas=2, priority="low", submitted_at=0),
        make_job("vision-1", "vision", 8, submitted_at=1),
        make_job("vision-2", "vision", 1, priority="low", submitted_at=2),
        make_job("nlp-6", "nlp", 8, submitted_at=6),
        make_job("vision-7", "vision", 1, submitted_at=7),
        make_job("nlp-9", "nlp", 4, replicas=2, priority="low", submitted_at=9),
        make_job("notebook", "nlp", 1, submitted_at=100),
    ]
    replay = Replay(
        [make_node("n0"), make_node("n2")],
        tenants,
        {job.id: make_running(job, ("n0", devices)) for job, devices in on_n0},
        {job.id: job for job in queue},
        stop_cycles=3,
    )
    replay.run(cycles=12)
    assert replay.preempted == Counter({"nlp-6": 1})
