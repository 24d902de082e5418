"""Cost lines of any window of whole hours: a statement's lines, split finer where asked.

The cost API, its exports and the finance page read these. For the hours of a window that a
closed statement of the organisation covers whole, the lines are that statement's frozen
lines (adjustments included): what finance closed is what the API says, whatever changes
afterwards (a policy, a quota, a job event that reclassifies an attempt). The other hours
are rated from the metered usage records by the statements' own code
(`statements.organisation_lines`), never from the allocations: exactly the lines a close of
those hours would freeze. tests/billing/test_costs_api.py checks both to the cent.

Statement lines carry no job type or priority class; each line's parts do
(`statements.split_lines`: its rounded amount apportioned over its job types and classes by
the largest remainder method), frozen with it at the close (`StatementLine.split`: job
type, class, amount, GPU-hours and, since it is kept, the part's exact quantity in the line's
unit), so any aggregation adds up to the statement. A line closed before the parts were
kept counts as one part without a job type or class.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime, timedelta
from decimal import Decimal
from fractions import Fraction
from typing import Any

from billing.models import Statement, StatementLine
from billing.periods import month_end, month_start
from billing.rates.cards import metered_until
from billing.statements import line_memo
from billing.statements.rollup import DraftLine, SplitsMemo, organisation_lines
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
    # The exact quantity in the resource's unit (rating.UNITS: GPU-, core-, GiB-hours; none
    # for adjustments) and the unit price billed (the rate card's x the class's multiplier x
    # (1 - the borrowed discount, for borrowed capacity)), the statement line's.
    quantity: Fraction = Fraction(0)
    rate: Decimal = Decimal(0)
    # The cluster whose usage the line prices, by name: the statement line's (issue 38).
    cluster: str = ""


def organisation_costs(
    organisation: Tenant, start: datetime, end: datetime, *, splits: SplitsMemo | None = None
) -> list[CostLine]:
    """Every cost line of `organisation` in the metered hours of [start, end): the frozen
    lines of its closed statements inside the window, the rest rated. DomainError when a
    flavor used in a rated hour has no rate for it. `splits`: shared by the organisations
    rated for one request (statements.SplitsMemo)."""
    closed = list(
        Statement.objects.filter(
            organisation=organisation, period_start__gte=start, period_end__lte=end
        ).order_by("period_start")
    )
    lines = [line for statement in closed for line in _frozen(organisation, statement)]
    for lo, hi in _open(start, end, [(s.period_start, s.period_end) for s in closed]):

        def rate(lo: datetime = lo, hi: datetime = hi) -> list[line_memo.Row]:
            return [
                _kept(cost)
                for draft in organisation_lines(organisation, lo, hi, splits=splits)
                for cost in _costs(organisation, draft)
            ]

        lines += line_memo.remembered(line_memo.inputs_key(organisation, lo, hi), rate, _unkept)
    return lines


def _kept(line: CostLine) -> line_memo.Row:
    """A line as line_memo keeps it: plain values (the amount as text, the GPU-hours as
    numerator and denominator)."""
    return (
        *(getattr(line, name) for name in _HEAD),
        str(line.amount),
        line.gpu_hours.numerator,
        line.gpu_hours.denominator,
        line.charged,
        line.quantity.numerator,
        line.quantity.denominator,
        str(line.rate),
        line.cluster,
    )


def _unkept(rows: list[line_memo.Row]) -> tuple[CostLine, ...]:
    return tuple(
        CostLine(
            *head,  # type: ignore[arg-type, call-arg]
            Decimal(amount),
            Fraction(numerator, denominator),
            charged,
            Fraction(q_num, q_den),
            Decimal(rate),
            cluster,
        )
        for *head, amount, numerator, denominator, charged, q_num, q_den, rate, cluster in rows
    )


_HEAD = (
    "organisation",
    "tenant",
    "project",
    "user",
    "flavor",
    "resource",
    "kind",
    "job_type",
    "priority_class",
)


def open_month_rated() -> int:
    """Rate the month of the last metered hour for every organisation, so that the first
    reader of the cost routes finds its lines kept (billing/statements/line_memo.py): metering runs
    this once it has metered an hour. An organisation that cannot be priced (a flavor used
    without a rate) is left to its readers, who get the error. Returns those rated."""
    until = metered_until()
    if until is None:
        return 0
    start = month_start(until - timedelta(microseconds=1))
    rated = 0
    splits: SplitsMemo = {}  # the cluster's, split once for every organisation
    for organisation in Tenant.objects.filter(parent=None).order_by("id"):
        try:
            organisation_costs(organisation, start, month_end(start), splits=splits)
        except DomainError:
            continue
        rated += 1
    return rated


def _open(
    start: datetime, end: datetime, closed: list[tuple[datetime, datetime]]
) -> Iterator[tuple[datetime, datetime]]:
    """The parts of [start, end) outside the closed periods (sorted, not overlapping)."""
    for lo, hi in closed:
        if lo > start:
            yield start, lo
        start = max(start, hi)
    if start < end:
        yield start, end


def _costs(organisation: Tenant, draft: DraftLine) -> Iterator[CostLine]:
    line = draft.line
    account: Any = line.account
    tenant, project, user = account
    for part in draft.parts:
        yield CostLine(
            organisation.pk,
            tenant,
            project,
            user,
            line.flavor,
            line.resource,
            line.kind,
            part.job_type,
            part.priority_class,
            part.amount,
            part.gpu_hours,
            draft.charged,
            part.quantity,
            line.rate,
            line.cluster,
        )


def _frozen(organisation: Tenant, statement: Statement) -> Iterator[CostLine]:
    rows = StatementLine.objects.filter(statement=statement).order_by("id")
    for (
        tenant,
        project,
        user,
        flavor,
        resource,
        kind,
        quantity,
        rate,
        amount,
        charged,
        split,
        cluster,
    ) in rows.values_list(
        "tenant_id",
        "project_id",
        "user_id",
        "flavor",
        "resource",
        "kind",
        "quantity",
        "rate",
        "amount",
        "charged",
        "split",
        "cluster",
    ):
        parts = split or [["", "", str(amount), str(quantity if resource == "gpu" else 0)]]
        for job_type, priority_class, part_amount, gpu_hours, *kept in parts:
            yield CostLine(
                organisation.pk,
                tenant,
                project,
                user,
                flavor,
                resource,
                kind,
                job_type,
                priority_class,
                Decimal(part_amount),
                Fraction(gpu_hours),
                charged,
                _part_quantity(kept, resource, gpu_hours, quantity, part_amount, amount),
                rate,
                cluster,
            )


def _part_quantity(
    kept: list[str], resource: str, gpu_hours: str, quantity: Decimal, part: str, whole: Decimal
) -> Fraction:
    """A frozen part's exact quantity: kept with it (its fifth value); for a part closed
    before that, its GPU-hours (exact), or the line's quantity apportioned by amount."""
    if kept:
        return Fraction(kept[0])
    if resource == "gpu":
        return Fraction(gpu_hours)
    if not whole:
        return Fraction(quantity)
    return Fraction(quantity) * Fraction(part) / Fraction(whole)
