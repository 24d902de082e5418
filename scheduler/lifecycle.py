"""The job state machine. Every transition is a compare-and-swap with its event row.

`job_transition` issues `UPDATE job SET state=to WHERE id=? AND state=from` and writes the
event in the same transaction. When two callers race, the database serialises the UPDATEs on
the row lock; the second re-reads the row, finds the state changed, updates nothing and gets
ConflictError. A transition therefore happens once or not at all.
"""

from __future__ import annotations

from typing import Any

from django.db import transaction
from django.db.models import F
from django.utils import timezone

from common.errors import ConflictError
from scheduler.admission import jobs_final
from scheduler.job_notifications import job_events_notify
from scheduler.models import FINAL_STATES, Job, JobEvent, JobState

S = JobState

# from-state -> states it may move to. Cancel is allowed from every non-final state.
TRANSITIONS: dict[str, frozenset[str]] = {
    S.PENDING_APPROVAL: frozenset({S.QUEUED, S.REJECTED, S.CANCELLED}),
    S.QUEUED: frozenset({S.ADMITTED, S.CANCELLED}),
    # admitted -> queued: a claim released (bind failed, lease lost) before anything ran;
    # admitted -> failed: binding refused past its attempt limit.
    # Every state that holds devices (admitted, binding, running) may be preempted or drained:
    # a job whose pods never start must not hold its devices and quota beyond reclaim.
    S.ADMITTED: frozenset({S.BINDING, S.QUEUED, S.FAILED, S.PREEMPTED, S.CANCELLED}),
    S.BINDING: frozenset({S.RUNNING, S.QUEUED, S.FAILED, S.PREEMPTED, S.CANCELLED}),
    # running -> queued: a failed attempt retried per the job's retry policy.
    S.RUNNING: frozenset({S.SUCCEEDED, S.FAILED, S.PREEMPTED, S.QUEUED, S.CANCELLED}),
    S.PREEMPTED: frozenset({S.QUEUED, S.CANCELLED}),
    S.SUCCEEDED: frozenset(),
    S.FAILED: frozenset(),
    S.CANCELLED: frozenset(),
    S.REJECTED: frozenset(),
}

assert all(not TRANSITIONS[s] for s in FINAL_STATES)
assert all(S.CANCELLED in TRANSITIONS[s] for s in S if s not in FINAL_STATES)


# The states in which a job holds (or is about to hold) an allocation.
HOLDING_STATES = (S.ADMITTED, S.BINDING, S.RUNNING)
assert all(S.PREEMPTED in TRANSITIONS[s] for s in HOLDING_STATES)


def is_allowed(from_state: str, to_state: str) -> bool:
    return to_state in TRANSITIONS.get(from_state, frozenset())


def _timestamps(to_state: str, now: Any) -> dict[str, Any]:
    if to_state == S.QUEUED:
        return {"queued_at": now}
    if to_state == S.RUNNING:
        return {"started_at": now}
    if to_state in FINAL_STATES:
        return {"finished_at": now}
    return {}


@transaction.atomic
def job_transition(
    *,
    job: Job,
    to_state: str,
    actor: Any = None,
    message: str = "",
    kind: str = "state",
    data: dict[str, Any] | None = None,
    new_attempt: bool = False,
) -> Job:
    """Move `job` from the state it was read in to `to_state`, or raise ConflictError.

    `job.state` is the expected current state (the compare of the compare-and-swap).
    `new_attempt` raises the attempt counter (a requeue after preemption or a failed attempt).
    """
    from_state = job.state
    if not is_allowed(from_state, to_state):
        raise ConflictError(f"A job cannot go from {from_state} to {to_state}.")
    now = timezone.now()
    updates: dict[str, Any] = {"state": to_state, "updated_at": now, **_timestamps(to_state, now)}
    if new_attempt:
        updates["attempt"] = F("attempt") + 1
    if to_state != S.QUEUED:
        updates["reason"] = ""
    changed = Job.objects.filter(pk=job.pk, state=from_state).update(**updates)
    if changed != 1:
        current = Job.objects.filter(pk=job.pk).values_list("state", flat=True).first()
        raise ConflictError(
            f"Job {job.pk} is {current or 'gone'}, not {from_state}; nothing was changed."
        )
    JobEvent.objects.create(
        job=job,
        kind=kind,
        from_state=from_state,
        to_state=to_state,
        message=message,
        actor=actor if getattr(actor, "is_authenticated", False) else None,
        data=data or {},
    )
    job_events_notify([(job.pk, kind, from_state, to_state, message)])
    if to_state in FINAL_STATES:
        jobs_final([job.pk])
    job.refresh_from_db()
    return job
