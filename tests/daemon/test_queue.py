"""The queue window the engine sees (`scheduler.snapshot.queue`): every queue's heads taken
round-robin, and the shallow read of the heads giving the full window."""

from __future__ import annotations

import pytest

from scheduler.models import Job
from scheduler.snapshot.build import build_snapshot
from scheduler.snapshot.queue import _queue, queue_heads
from tests.daemon.conftest import Env


def test_queue_window_takes_every_queues_heads_round_robin(env: Env) -> None:
    """When the queue heads are more than `max_pending`, each queue (tenant x priority class)
    gets its turn: high-priority jobs that cannot fit must not hide the low-priority ones
    that could fill the gaps."""
    high = [env.submit(priority_class="high") for _ in range(6)]
    low = [env.submit(priority_class="low") for _ in range(2)]
    seen = build_snapshot(env.clock(), decayed={}, max_pending=4, per_queue=5).snapshot.pending
    # round-robin: the first of each queue, then the second of each
    assert sorted(int(j.id) for j in seen) == sorted(j.pk for j in [*high[:2], *low])
    # ordered for the engine by priority, then age
    assert [int(j.id) for j in seen] == [j.pk for j in [*high[:2], *low]]
    # without per_queue: by priority, then age
    seen = build_snapshot(env.clock(), decayed={}, max_pending=4).snapshot.pending
    assert [int(j.id) for j in seen] == [j.pk for j in high[:4]]


@pytest.mark.postgresql(
    "queue_heads is PostgreSQL SQL (LATERAL); SQLite reads the window through the ORM"
)
def test_queue_heads_read_shallow_give_the_full_window(env: Env) -> None:
    """`queue_heads` reads each queue only as deep as the round-robin reaches, sized from the
    queues it found last time; whatever that guess, its window is the one the full-depth
    read gives, also when queues ran dry since (it must read again, deeper)."""

    def full(max_pending: int, per_queue: int) -> set[int]:
        return set(_queue(max_pending, per_queue).values_list("id", flat=True))

    def shallow(max_pending: int, per_queue: int) -> set[int]:
        return {job_id for job_id, _ in queue_heads(max_pending, per_queue)}

    classes = ("critical", "high", "normal", "low")
    jobs = {(user, c): [env.submit(user=user, priority_class=c) for _ in range(2)]
            for user in ("alice", "bob-bravo") for c in classes}  # fmt: skip
    jobs["alice", "normal"] += [env.submit(priority_class="normal") for _ in range(8)]
    # 8 queues: a window of 8 takes one head each, and the next read guesses depth 3
    assert shallow(8, 6) == full(8, 6) and len(full(8, 6)) == 8
    assert shallow(8, 6) == full(8, 6)
    # all but one queue run dry: depth 3 finds 3 jobs, so it must read to depth 6
    Job.objects.exclude(id__in=[j.pk for j in jobs["alice", "normal"]]).update(state="cancelled")
    assert len(full(8, 6)) == 6
    assert shallow(8, 6) == full(8, 6)
    # fewer jobs than the window: nothing left out
    assert shallow(20, 20) == full(20, 20) == {j.pk for j in jobs["alice", "normal"]}
