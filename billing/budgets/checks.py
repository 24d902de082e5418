"""Budgets and cost rules at a job's admission (registered in scheduler.jobs.hooks).

- At submit (`budget_admission_check`, before the job is saved): the cost-based approval
  rule ("estimated cost over N"), and the policy of every budget over the job's tenant and
  its ancestors that the job would take past 100 % (or that is there already): `notify`
  lets it through (the 100 % alert goes out when it is reserved), `approval` sends it to
  approval with the budget figures, `best-effort` moves it to the best-effort class, `hard`
  refuses it (`BudgetRefused`, a 409 naming the budget, its spend and the job's worst case).
- At approval (billing/budgets/approval.py): the budgets are judged again, at that moment.
- When the job enters the queue (`reservation_make`: at submit without approval, or at the
  approval): its projected cost is reserved, one row per job.
- When it ends, in any final state (`reservations_release`): the reservation is given back.
  `reservations_sweep` (beat) releases those of jobs already final, should a hook be missed.

The projected cost is the estimate's high end, the worst case (the dearest allowed flavor,
the most replicas, (retry limit + 1) attempts of the maximum runtime); a job without a
maximum runtime may run to the month's end at that price.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal
from typing import Any

from django.db import transaction
from django.utils import timezone

from billing.budgets.spend import (
    BudgetPosition,
    alerts_check_later,
    budgets_over,
    month_end,
    month_start,
    position_of,
)
from billing.costs.projection import CostEstimate, job_cost_estimate
from billing.models import Budget, BudgetPolicy, BudgetReservation, BudgetUnit
from common.errors import ConflictError
from scheduler.jobs.hooks import Verdict
from scheduler.models import FINAL_STATES
from tenants.approval_rules import RuleMatch, policies_applying, policy_describe
from tenants.models import ApprovalRule, PriorityClass

BUDGET_RULE = "budget"

# The hooks are called by the scheduler, which passes no time: tests replace this clock.
clock: Callable[[], datetime] = timezone.now


@dataclass(frozen=True)
class Projection:
    """What a job may cost from `at`, at worst: money (to the cent) and GPU-hours."""

    estimate: CostEstimate
    money: Decimal
    gpu_hours: Decimal
    runtime_s: int  # every attempt's maximum runtime together, or the seconds to month end

    def in_unit(self, unit: str) -> Decimal:
        return self.gpu_hours if unit == BudgetUnit.GPU_HOURS else self.money


def job_projection(job: Any, *, at: datetime) -> Projection:
    """The job's worst case (`CostEstimate.high`): (retry limit + 1) attempts of its maximum
    runtime at its most replicas; a job without a maximum runtime runs to the month's end."""
    estimate = job_cost_estimate(job, at=at)
    runtime = estimate.high_runtime_s
    if runtime is None:
        runtime = int((month_end(month_start(at)) - at).total_seconds())
    money = estimate.high if estimate.high is not None else estimate.cost_for(runtime)
    gpus = Decimal(estimate.replicas_max * job.gpu_milli_per_replica) / 1000
    gpu_hours = (gpus * runtime / 3600).quantize(Decimal("0.000001"))
    return Projection(estimate, money, gpu_hours, runtime)


class BudgetRefused(ConflictError):
    """A job a `hard` budget refuses (409): it names the budget, its spend and the job's
    projected (worst-case) cost. `breach` holds those figures where the refusing budget is
    known (a quote shows them: billing.costs.quotes)."""

    def __init__(self, message: str, *, breach: BudgetBreach | None = None) -> None:
        super().__init__(message)
        self.breach = breach


@dataclass(frozen=True)
class BudgetBreach:
    """A budget the job would take to 100 % or beyond: its position with the job counted."""

    position: BudgetPosition  # committed includes the job's projected cost
    slug: str
    projected: Decimal = Decimal(0)  # the job's worst case, in the budget's unit

    @property
    def reason(self) -> str:
        p = self.position
        used = p.spent + p.committed
        limit = f"{p.limit:,.2f}" + (" GPU-hours" if p.unit == BudgetUnit.GPU_HOURS else "")
        return (
            f"would take {self.slug}'s budget for {p.month:%Y-%m} to {p.percent_text} % "
            f"({p.figure(used)} of {limit})"
        )

    def refusal(self, when: str) -> str:
        """Why a hard budget refuses the job, e.g. at "submit"."""
        p = self.position
        committed = p.committed - self.projected
        return (
            f"Refused at {when}: {self.slug}'s budget for {p.month:%Y-%m} (budget {p.budget_id}) "
            f"is hard: {p.figure(p.spent)} spent and {p.figure(committed)} committed of "
            f"{p.figure(p.limit)}, and this job may cost up to {p.figure(self.projected)} "
            f"(its worst case), which {self.reason}. Nothing was created; ask for less (a "
            "shorter max_runtime_s, fewer retries or replicas) or for a higher limit."
        )

    def as_json(self) -> dict[str, Any]:
        return {"tenant": self.slug, **self.position.as_json()}


def budget_breaches(
    job: Any, projection: Projection, *, at: datetime, budgets: list[Budget] | None = None
) -> list[BudgetBreach]:
    """The month's budgets over the job's tenant and ancestors (root first) that the job
    would take past their limit, or that are at or past it already (`budgets`: those
    budgets, when the caller has just read them)."""
    found = []
    for budget in budgets_over(job.tenant, at) if budgets is None else budgets:
        extra = projection.in_unit(budget.unit)
        after = position_of(budget, extra=extra)
        used_before = after.spent + after.committed - extra
        if used_before >= budget.limit or after.spent + after.committed > budget.limit:
            found.append(BudgetBreach(after, budget.tenant.slug, extra))
    return found


def cost_rule_matches(job: Any, projection: Projection) -> list[RuleMatch]:
    """The "estimated cost over N" policies the job matches; an unbounded runtime is over."""
    matches = []
    for policy in policies_applying(job.tenant, jobs=True):
        if policy.rule != ApprovalRule.COST_OVER:
            continue
        by = f"(policy of '{policy.tenant.slug}': {policy_describe(policy)})"
        high = projection.estimate.high
        if high is None:
            reason = f"has no maximum runtime, so its cost is unbounded {by}"
        elif high > (policy.threshold or 0):
            attempts = projection.estimate.attempts_max
            over = f" over {attempts} attempts" if attempts > 1 else ""
            reason = f"may cost up to {projection.estimate.currency} {high:,.2f}{over} {by}"
        else:
            continue
        matches.append(RuleMatch(policy.pk, policy.rule, reason))
    return matches


def budgets_lock(tenant: Any, *, at: datetime) -> bool:
    """Lock the month's budget rows over `tenant`, root first (one order for every submit,
    since ancestors come before descendants: no deadlock between two subtrees). False when
    there is none (most submissions: nothing to read again once locked)."""
    found = budgets_over(tenant, at)
    for budget in found:  # root first
        list(Budget.objects.select_for_update().filter(pk=budget.pk).values_list("pk"))
    return bool(found)


def best_effort_class() -> PriorityClass | None:
    """The class jobs over a best-effort budget run at: 'best-effort', or else the lowest
    class that runs only on idle capacity."""
    return (
        PriorityClass.objects.filter(name="best-effort").first()
        or PriorityClass.objects.filter(counts_against_quota=False).order_by("value").first()
    )


def budget_admission_check(job: Any, *, lock: bool = True) -> Verdict:
    """Scheduler's admission check: cost rules and budget policies for an unsaved job.

    With `lock` (submit, in its transaction) the month's budgets over the job are locked
    first, root first, before their positions are read: jobs submitted together against a
    budget are judged one after another, each seeing the reservations of those before it
    (without, two jobs could each find room for themselves and together overrun it)."""
    now = clock()
    projection = job_projection(job, at=now)
    # Read after the lock, when there is one to read: their positions as the lock left them.
    none = lock and not budgets_lock(job.tenant, at=now)
    breaches = budget_breaches(job, projection, at=now, budgets=[] if none else None)
    hard = next((b for b in breaches if b.position.policy == BudgetPolicy.HARD), None)
    if hard is not None:
        raise BudgetRefused(hard.refusal("submit"), breach=hard)
    approvals = cost_rule_matches(job, projection)
    payload: dict[str, Any] = {}
    if approvals or breaches:
        payload["estimated_cost"] = projection.estimate.as_json()
    if breaches:
        payload["budgets"] = [b.as_json() for b in breaches]
    for breach in breaches:
        if breach.position.policy == BudgetPolicy.APPROVAL:
            approvals.append(RuleMatch(None, BUDGET_RULE, breach.reason))
    demote = next((b for b in breaches if b.position.policy == BudgetPolicy.BEST_EFFORT), None)
    target = best_effort_class() if demote is not None else None
    if demote is None or target is None or target.pk == job.priority_class_id:
        return Verdict(approvals=tuple(approvals), payload=payload)
    reason = f"runs at {target.name}: it {demote.reason}, whose policy at 100 % is best-effort"
    return Verdict(
        approvals=tuple(approvals), payload=payload, priority_class=target, reason=reason
    )


def reservation_make(job: Any) -> None:
    """Reserve the projected cost of a job that just entered the queue (in its transaction);
    once per job. The budgets over it are checked for alerts once committed."""
    now = clock()
    projection = job_projection(job, at=now)
    # One statement (a job's reservation made before stays as it is): a lookup, a savepoint
    # and an insert were three more round trips in every submission.
    reservation = BudgetReservation(
        job_id=job.pk,
        tenant_id=job.tenant_id,
        amount=projection.money,
        gpu_hours=projection.gpu_hours,
        created_at=now,
    )
    BudgetReservation.objects.bulk_create([reservation], ignore_conflicts=True)
    tenants, month = [job.tenant_id], month_start(now)
    transaction.on_commit(lambda: alerts_check_later(tenants, month))


def reservations_release(job_ids: Sequence[int]) -> int:
    """Give back the reservations of jobs that reached a final state; idempotent."""
    return BudgetReservation.objects.filter(
        job_id__any=list(job_ids), released_at__isnull=True
    ).update(released_at=clock())


def reservations_sweep() -> int:
    """Release the reservations of jobs already final (a hook missed: a bulk path, a
    crash between); the number released."""
    return BudgetReservation.objects.filter(
        released_at__isnull=True, job__state__in=FINAL_STATES
    ).update(released_at=clock())
