"""Budgets judged again when a job is approved (registered in scheduler.jobs.hooks).

A job waiting for approval reserves nothing, so jobs approved one after another could each
have fitted a budget when submitted and together overrun it. The approving transaction locks
the month's budgets over the job (root first, as submit does) and judges the job's worst case
against them as they stand now:

- `hard`: the approval is refused (`BudgetRefused`, a 409): the request stays pending, to be
  rejected or to expire;
- `approval`: let through when the request asked about that budget (the approver was shown
  it goes over); otherwise refused (409), since the approver was never asked about it;
- `best-effort`: the job is queued at the best-effort class, as at submit;
- `notify`: queued; the 100 % alert goes out when it is reserved.
"""

from __future__ import annotations

from typing import Any

from billing.budgets import checks as admission
from billing.budgets.checks import (
    BudgetBreach,
    BudgetRefused,
    best_effort_class,
    budget_breaches,
    budgets_lock,
    job_projection,
)
from billing.models import BudgetPolicy
from scheduler.jobs.hooks import Verdict


def _asked(request: Any) -> set[str]:
    """The tenants whose `approval` budget the request was made for (its payload's figures)."""
    budgets = (request.payload or {}).get("budgets") or []
    return {b.get("tenant") for b in budgets if b.get("policy") == BudgetPolicy.APPROVAL}


def _unasked(breach: BudgetBreach, job: Any) -> str:
    return (
        f"Not approved: queuing job {job.name} now {breach.reason}, whose policy at 100 % is "
        "approval, and this request was not made for that budget (other jobs were admitted "
        "since). Nothing was changed: reject it, and a new submit asks for the budget too."
    )


def budget_approving_check(job: Any, request: Any) -> Verdict:
    """The approving transaction's check of the budgets over `job`; raises BudgetRefused to
    refuse the approval (the decision rolls back)."""
    now = admission.clock()  # tests replace it
    budgets_lock(job.tenant, at=now)
    breaches = budget_breaches(job, job_projection(job, at=now), at=now)
    asked = _asked(request)
    for breach in breaches:
        policy = breach.position.policy
        if policy == BudgetPolicy.HARD:
            raise BudgetRefused(breach.refusal("approval"))
        if policy == BudgetPolicy.APPROVAL and breach.slug not in asked:
            raise BudgetRefused(_unasked(breach, job))
    demote = next((b for b in breaches if b.position.policy == BudgetPolicy.BEST_EFFORT), None)
    target = best_effort_class() if demote is not None else None
    if demote is None or target is None or target.pk == job.priority_class_id:
        return Verdict()
    reason = f"runs at {target.name}: it {demote.reason}, whose policy at 100 % is best-effort"
    return Verdict(priority_class=target, reason=reason)
