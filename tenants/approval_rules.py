"""Which approval policies a job or a quota change matches, with a reason a person can read.

Pure reads: the policies of the tenant and of all its ancestors apply, nearest last.
"""

from __future__ import annotations

from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from django.conf import settings

from common.db.shared_reads import shared
from tenants.models import ApprovalPolicy, ApprovalRule, Tenant
from tenants.quotas.rules import QuotaValues, gpus


@dataclass(frozen=True)
class RuleMatch:
    """One matched rule. `policy_id` is None for a rule that always applies."""

    policy_id: int | None
    rule: str
    reason: str

    def as_json(self) -> dict[str, Any]:
        return {"policy": self.policy_id, "rule": self.rule, "reason": self.reason}


@shared
def policies_applying(tenant: Tenant, *, jobs: bool) -> list[ApprovalPolicy]:
    """Active policies of `tenant` and its ancestors for jobs (or quota requests), root first."""
    rows = ApprovalPolicy.objects.filter(tenant_id__in=tenant.ancestor_ids(), active=True)
    rows = rows.filter(applies_to_jobs=True) if jobs else rows.filter(applies_to_quota=True)
    return sorted(
        rows.select_related("tenant", "priority_class"), key=lambda p: (p.tenant.depth, p.pk)
    )


def policy_describe(policy: ApprovalPolicy) -> str:
    """The rule in words, e.g. 'GPUs over 8' or 'priority at or above high'."""
    threshold = f"{policy.threshold.normalize():f}" if policy.threshold is not None else ""
    currency = settings.GANTRY_BILLING_CURRENCY
    words: dict[str, str] = {
        ApprovalRule.GPUS_OVER: f"GPUs over {threshold}",
        ApprovalRule.GPU_HOURS_OVER: f"estimated GPU-hours over {threshold}",
        ApprovalRule.PRIORITY_AT_LEAST: "priority at or above "
        + (policy.priority_class.name if policy.priority_class else "?"),
        ApprovalRule.BORROWING: "borrowing beyond guarantee",
        ApprovalRule.RUNTIME_OVER_HOURS: f"runtime over {threshold} hours",
        ApprovalRule.COST_OVER: f"estimated cost over {currency} {threshold}",
    }
    return words.get(policy.rule, policy.rule)


def _num(value: Decimal | None) -> float:
    return float(value or 0)


def _job_reason(
    policy: ApprovalPolicy,
    *,
    gpus_milli: int,
    est_gpu_hours: float | None,
    priority_value: int,
    borrowing: bool,
    runtime_hours: float | None,
) -> str | None:
    """The reason `policy` sends the job to approval, or None. Unknown runtimes are unbounded."""
    by = f"(policy of '{policy.tenant.slug}': {policy_describe(policy)})"
    limit = _num(policy.threshold)
    rule = policy.rule
    if rule == ApprovalRule.GPUS_OVER and gpus_milli > limit * 1000:
        return f"asks for {gpus(gpus_milli)} {by}"
    if rule == ApprovalRule.GPU_HOURS_OVER:
        if est_gpu_hours is None:
            return f"has no runtime limit, so its GPU-hours are unbounded {by}"
        if est_gpu_hours > limit:
            return f"may use up to {est_gpu_hours:.4g} GPU-hours (every attempt) {by}"
    pc = policy.priority_class
    if rule == ApprovalRule.PRIORITY_AT_LEAST and pc is not None and priority_value >= pc.value:
        return f"has priority {priority_value} {by}"
    if rule == ApprovalRule.BORROWING and borrowing:
        return f"would take the team beyond its guaranteed quota {by}"
    if rule == ApprovalRule.RUNTIME_OVER_HOURS:
        if runtime_hours is None:
            return f"has no maximum runtime {by}"
        if runtime_hours > limit:
            return f"may run {runtime_hours:.4g} hours {by}"
    return None


def job_matches(
    *,
    tenant: Tenant,
    gpus_milli: int,
    est_gpu_hours: float | None,
    priority_value: int,
    borrowing: bool,
    runtime_hours: float | None,
) -> list[RuleMatch]:
    matches = []
    for policy in policies_applying(tenant, jobs=True):
        reason = _job_reason(
            policy,
            gpus_milli=gpus_milli,
            est_gpu_hours=est_gpu_hours,
            priority_value=priority_value,
            borrowing=borrowing,
            runtime_hours=runtime_hours,
        )
        if reason:
            matches.append(RuleMatch(policy.pk, policy.rule, reason))
    return matches


def quota_matches(tenant: Tenant, values: QuotaValues) -> list[RuleMatch]:
    """Quota changes always go to the admins above; policies add their own reasons.

    Of the rule kinds, 'GPUs over N' (on the requested limit) and 'borrowing' (a limit above
    the guarantee) apply to quota requests; the job-only kinds never match one.
    """
    matches = [
        RuleMatch(
            None, "quota_change", f"quota changes of '{tenant.slug}' are decided by admins above it"
        )
    ]
    for policy in policies_applying(tenant, jobs=False):
        by = f"(policy of '{policy.tenant.slug}': {policy_describe(policy)})"
        if (
            policy.rule == ApprovalRule.GPUS_OVER
            and values.limit_milli > _num(policy.threshold) * 1000
        ):
            matches.append(
                RuleMatch(
                    policy.pk, policy.rule, f"asks for a limit of {gpus(values.limit_milli)} {by}"
                )
            )
        elif policy.rule == ApprovalRule.BORROWING and values.limit_milli > values.guaranteed_milli:
            extra = values.limit_milli - values.guaranteed_milli
            reason = f"lets the team borrow {gpus(extra)} beyond its guarantee {by}"
            matches.append(RuleMatch(policy.pk, policy.rule, reason))
    return matches
