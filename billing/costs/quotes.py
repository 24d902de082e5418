"""A quote: what a job would cost, whether it would need approval and why, and the budget
left, before anything is created (issue 18, "Quote before submit").

A quote builds the very job a submit would queue (`scheduler.jobs.services.job_build`: the same
validation, the same 400s and 403s) and judges it with the same approval rules, without a
lock and without writing a row. It answers for the moment it is made: a job submitted later
is judged again then (other jobs may have been queued meanwhile, a rate may have changed).

A quote is a question, not a submit: a job that a `hard` budget would refuse (submit's 409)
is still quoted, with `refused` saying so in submit's own words and the refusing budget's
figures, so that the user can change the job before submitting it.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from billing.budgets import checks as admission
from billing.budgets.spend import budgets_over, position_of
from billing.costs.projection import CostEstimate, job_cost_estimate
from billing.models import Budget
from scheduler.jobs.approvals import job_gpu_milli
from scheduler.jobs.services import Judgement, job_build, job_judge
from scheduler.models import Job
from tenants.approval_rules import RuleMatch
from tenants.models import Project


@dataclass(frozen=True)
class Quote:
    job: Job  # unsaved: what submit would create (in the class it would run at)
    estimate: CostEstimate
    approval: tuple[RuleMatch, ...]
    moved: str  # why it would run at another priority class (a budget's policy), or ""
    budget: dict[str, Any] | None  # the nearest budget over the job's tenant; None: none
    # Why a submit would be refused (a hard budget: `reason`, submit's 409 message, and that
    # `budget`'s figures); None: a submit would be taken. A refused job's approval is not
    # judged: submit stops at the refusal.
    refused: dict[str, Any] | None

    def as_json(self) -> dict[str, Any]:
        job = self.job
        return {
            "job": {
                "name": job.name,
                "job_type": job.job_type,
                "project": job.project_id,
                "tenant": job.tenant_id,
                "priority_class": job.priority_class.name,
                "priority_note": self.moved,
                "replicas": job.replicas,
                "gpus_total": job_gpu_milli(job) / 1000,
                "flavors": list(job.flavors or []),
                "max_runtime_s": job.max_runtime_s,
            },
            "estimate": self.estimate.as_json(),
            "approval": {
                "needed": bool(self.approval),
                "reasons": [match.as_json() for match in self.approval],
            },
            "budget": self.budget,
            # A job that can never run is refused (a 400 naming the fields), as at submit.
            "fits": True,
            "refused": self.refused,
        }


def _budget_left(job: Job, at: datetime) -> dict[str, Any] | None:
    """The nearest budget over the job's tenant (its own, else the nearest ancestor's)."""
    budgets = budgets_over(job.tenant, at)
    return _budget_json(budgets[-1], job, at) if budgets else None


def _refusal(job: Job, at: datetime, refused: admission.BudgetRefused) -> dict[str, Any]:
    """Submit's refusal of `job`: its message, and the refusing budget's figures (the
    nearest budget over the job's tenant or an ancestor's; null if it is gone since)."""
    budget = None
    if refused.breach is not None:
        budgets = Budget.objects.select_related("tenant")
        budget = budgets.filter(pk=refused.breach.position.budget_id).first()
    return {
        "reason": str(refused),
        "budget": None if budget is None else _budget_json(budget, job, at),
    }


def _budget_json(budget: Budget, job: Job, at: datetime) -> dict[str, Any]:
    """`budget` as it stands, and what would be left once the job's projected cost is
    reserved."""
    position = position_of(budget)
    projected = admission.job_projection(job, at=at).in_unit(budget.unit)
    return {
        "tenant": budget.tenant.slug,
        **position.as_json(),
        "job_projected": f"{projected:f}",
        "remaining_after": f"{position.remaining - projected:f}",
    }


def job_quote(
    *, user: Any, project: Project, payload: dict[str, Any], at: datetime | None = None
) -> Quote:
    """Quote submitting `payload` to `project` as `user` at `at` (by default the clock the
    budget checks read).

    Raises what `job_submit` raises for the same body (PermissionDenied, ValidationError),
    but for a hard budget's refusal, which the quote reports (`Quote.refused`) instead.
    Judged by submit's own `job_judge` (approval rules, then budgets and cost rules), so a
    quote needs approval iff a submit at that moment would, and is refused iff it would be.
    Reads only: no Job, JobEvent, ApprovalRequest or AuditEntry row is written, and no row
    is locked (the borrowing rule's lock serialises submits, which decide; a quote decides
    nothing), so it may run outside a transaction and never holds up a submit."""
    job = job_build(user=user, project=project, payload=payload)
    at = at or admission.clock()
    refusal = None
    try:
        judged = job_judge(job, lock=False)
    except admission.BudgetRefused as refused:  # submit stops there: no approval is judged
        judged = Judgement(approval=[], verdicts=[], moved=None)
        refusal = _refusal(job, at, refused)
    return Quote(
        job=job,
        estimate=job_cost_estimate(job, at=at),
        approval=tuple(judged.approval),
        moved=judged.moved.reason if judged.moved is not None else "",
        budget=_budget_left(job, at),
        refused=refusal,
    )
