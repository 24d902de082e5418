"""The job state machine: which state may follow which (`TRANSITIONS`, `is_allowed`).

Every transition is a compare-and-swap with its event row, written by
`scheduler.jobs.transitions.transition` (one job or many) under this table: the row is locked,
its state compared with the expected one, and only then written. When two callers race, the
second finds the state changed, writes nothing and reports a miss (ConflictError for
`job_transition`). A transition therefore happens once or not at all.
"""

from __future__ import annotations

from scheduler.models import FINAL_STATES, HOLDING_STATES, JobState

S = JobState

# from-state -> states it may move to. Cancel is allowed from every non-final state.
TRANSITIONS: dict[str, frozenset[str]] = {
    S.PENDING_APPROVAL: frozenset({S.QUEUED, S.REJECTED, S.CANCELLED}),
    # queued/preempted -> succeeded: a user's Kubernetes object (issue 37) that completed as
    # Gantry preempted its job: its pods finished before they were stopped, and its work is
    # done (`scheduler.workloads.mirror.end_finished`); nothing else ends a job not running.
    S.QUEUED: frozenset({S.ADMITTED, S.SUCCEEDED, S.CANCELLED}),
    # admitted -> queued: a claim released (bind failed, lease lost) before anything ran;
    # admitted -> failed: binding refused past its attempt limit.
    # Every state that holds devices (admitted, binding, running) may be preempted or drained:
    # a job whose pods never start must not hold its devices and quota beyond reclaim.
    S.ADMITTED: frozenset({S.BINDING, S.QUEUED, S.FAILED, S.PREEMPTED, S.CANCELLED}),
    S.BINDING: frozenset({S.RUNNING, S.QUEUED, S.FAILED, S.PREEMPTED, S.CANCELLED}),
    # running -> queued: a failed attempt retried per the job's retry policy.
    S.RUNNING: frozenset({S.SUCCEEDED, S.FAILED, S.PREEMPTED, S.QUEUED, S.CANCELLED}),
    S.PREEMPTED: frozenset({S.QUEUED, S.SUCCEEDED, S.CANCELLED}),
    S.SUCCEEDED: frozenset(),
    S.FAILED: frozenset(),
    S.CANCELLED: frozenset(),
    S.REJECTED: frozenset(),
}

assert all(not TRANSITIONS[s] for s in FINAL_STATES)
assert all(S.CANCELLED in TRANSITIONS[s] for s in S if s not in FINAL_STATES)


__all__ = ["HOLDING_STATES", "TRANSITIONS", "is_allowed"]

assert all(S.PREEMPTED in TRANSITIONS[s] for s in HOLDING_STATES)


def is_allowed(from_state: str, to_state: str) -> bool:
    return to_state in TRANSITIONS.get(from_state, frozenset())
