"""Cost lines of any window of whole hours: a statement's lines, split finer where asked.

The cost API and the finance page read these. They are built from the metered usage records
and the rate cards by the same rating as statements (`statements.usage_lines`, `idle_lines`),
never from the allocations, so the lines of an organisation and window are exactly the lines
its statement for that window has (tests/billing/test_costs_api.py checks it to the cent),
plus the adjustment lines of its closed statements inside the window.

Statement lines carry no job type or priority class. To aggregate by them, each statement
line's rounded amount is apportioned over its job types and priority classes in proportion
to their exact amounts by the largest remainder method (`capacity.apportion`): the parts add
up to the line to the cent, so any aggregation adds up to the statement.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Hashable
from dataclasses import dataclass
from datetime import datetime, timedelta
from decimal import Decimal
from fractions import Fraction

from billing import rating
from billing.capacity import apportion
from billing.models import LineKind, StatementLine
from billing.statements import idle_lines, usage_lines
from common.errors import DomainError
from tenants.models import Tenant

# The longest window the cost API and its exports accept: a year and a month, so a year over
# year comparison fits, and a request cannot ask to rate the whole history at once.
MAX_WINDOW = timedelta(days=400)


@dataclass(frozen=True)
class CostLine:
    """One statement line, or the part of one that a job type and priority class carry."""

    organisation: int
    tenant: int
    project: int | None
    user: int | None
    flavor: str
    resource: str
    kind: str
    job_type: str
    priority_class: str
    amount: Decimal
    gpu_hours: Fraction
    charged: bool = True


def _split_used(organisation: Tenant, start: datetime, end: datetime) -> tuple[list, list]:
    """(statement lines of what jobs held, their cost lines split by job type and class)."""
    detailed = usage_lines(organisation, start, end, detail=True)
    groups: dict[rating.LineKey, list[rating.Line]] = defaultdict(list)
    for line in detailed:
        account = line.account[:3]  # type: ignore[index]
        groups[(account, line.flavor, line.resource, line.kind, line.rate)].append(line)
    statement: list[rating.Line] = []
    split: list[CostLine] = []
    for key, parts in groups.items():
        per_unit = rating.UNITS[key[2]][1]
        merged = rating.make_line(key, sum((p.exact for p in parts), Fraction(0)) * per_unit)
        statement.append(merged)
        total, amounts = apportion([Fraction(p.rate) * p.exact for p in parts])
        if total != merged.amount:  # the same exact sum rounded the same way: cannot differ
            raise AssertionError(f"apportioned {total} != line {merged.amount}")
        for part, amount in zip(parts, amounts, strict=True):
            job_type, priority_class = part.account[3:]  # type: ignore[index]
            split.append(_cost(organisation, part.account, part, job_type, priority_class, amount))
    return statement, split


def _cost(
    organisation: Tenant,
    account: Hashable,
    line: rating.Line,
    job_type: str,
    priority_class: str,
    amount: Decimal,
    charged: bool = True,
) -> CostLine:
    tenant, project, user = account[:3]  # type: ignore[index]
    return CostLine(
        organisation=organisation.pk,
        tenant=tenant,
        project=project,
        user=user,
        flavor=line.flavor,
        resource=line.resource,
        kind=line.kind,
        job_type=job_type,
        priority_class=priority_class,
        amount=amount,
        gpu_hours=line.exact if line.resource == "gpu" else Fraction(0),
        charged=charged,
    )


def organisation_costs(organisation: Tenant, start: datetime, end: datetime) -> list[CostLine]:
    """Every cost line of `organisation` in the metered hours of [start, end).
    DomainError when a flavor used has no rate for an hour of the window."""
    try:
        statement, lines = _split_used(organisation, start, end)
        idle = idle_lines(organisation, start, end, statement)
    except rating.MissingRate as missing:
        raise DomainError(f"{missing}: add a rate card for it first.") from None
    lines += [
        _cost(organisation, d.line.account, d.line, "", "", d.line.amount, d.charged) for d in idle
    ]
    adjustments = StatementLine.objects.filter(
        statement__organisation=organisation,
        statement__period_start__gte=start,
        statement__period_end__lte=end,
        kind=LineKind.ADJUSTMENT,
    ).values_list("tenant_id", "project_id", "amount")
    lines += [
        CostLine(
            organisation.pk,
            tenant,
            project,
            None,
            "",
            "",
            LineKind.ADJUSTMENT,
            "",
            "",
            amount,
            Fraction(0),
        )
        for tenant, project, amount in adjustments
    ]
    return lines
