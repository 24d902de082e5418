"""What other apps add to a job's submit and approval, and hear when jobs enter the queue or end.

The scheduler may not import billing (the import-linter layers), yet budgets and cost rules
decide about jobs at submit. So billing registers here at start-up (BillingConfig.ready):
- a submit check, called by `job_submit` inside its transaction before the job is
  saved: it may ask for approval (RuleMatch reasons, and figures for the request's payload)
  or move the job to another priority class (with the reason);
- an enqueued hook, called inside the transaction that puts a job in the queue
  (`scheduler.jobs.enqueue`, the one way in): at submit when no approval is needed, or when
  its approval is granted (not when the daemon requeues it: "admitted" is the daemon's claim);
- an approving check, called inside the transaction that approves a job, before it is
  queued: it judges again what may have changed since submit (budgets: other jobs admitted
  meanwhile). It may refuse the approval (a DomainError: the decision rolls back and the
  request stays pending) or move the job to another priority class (a Verdict);
- a final hook, called inside the transaction that moves jobs to a final state (every path:
  `scheduler.jobs.transitions.transition`, for one job or many), with their ids.
Hooks run in the caller's transaction, so what they write commits or rolls back with it;
they must be quick (the final hook runs in the scheduling cycle).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from tenants.approval_rules import RuleMatch
from tenants.models import PriorityClass


@dataclass(frozen=True)
class Verdict:
    """An admission check's word on a job; the default changes nothing."""

    approvals: tuple[RuleMatch, ...] = ()  # reasons the job must be approved
    payload: dict[str, Any] = field(default_factory=dict)  # for the approval request
    priority_class: PriorityClass | None = None  # run it at this class instead
    reason: str = ""  # why the class changed (the job's reason and an event)


# (unsaved job, lock=...) -> verdict. `lock`: inside submit's transaction, lock what the
# check reads so that jobs submitted together are judged one after another; a quote passes
# False (it decides nothing and must not wait for a submit).
SubmitCheck = Callable[..., Verdict]
# (job about to be queued, its approval request) -> verdict; raises to refuse the approval.
ApprovingCheck = Callable[[Any, Any], Verdict]
EnqueuedHook = Callable[[Any], object]  # (job now queued); the result is ignored
FinalHook = Callable[[Sequence[int]], object]  # (ids of jobs now final); result ignored

_checks: list[SubmitCheck] = []
_approving: list[ApprovingCheck] = []
_enqueued: list[EnqueuedHook] = []
_final: list[FinalHook] = []


def _add(hooks: list[Any], fn: Any) -> None:
    if fn not in hooks:  # ready() may run twice (tests, autoreload)
        hooks.append(fn)


def register_submit_check(fn: SubmitCheck) -> None:
    _add(_checks, fn)


def register_approving_check(fn: ApprovingCheck) -> None:
    _add(_approving, fn)


def register_on_enqueued(fn: EnqueuedHook) -> None:
    _add(_enqueued, fn)


def register_on_final(fn: FinalHook) -> None:
    _add(_final, fn)


def submit_verdicts(job: Any, *, lock: bool = True) -> list[Verdict]:
    return [check(job, lock=lock) for check in _checks]


def approving_verdicts(job: Any, request: Any) -> list[Verdict]:
    return [check(job, request) for check in _approving]


def job_enqueued(job: Any) -> None:
    for hook in _enqueued:
        hook(job)


def jobs_final(job_ids: Sequence[int]) -> None:
    if job_ids:
        for hook in _final:
            hook(job_ids)
