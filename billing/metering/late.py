"""Usage written after its hour was metered: found by a high-water mark, billed, never lost.

Metering reads, for each hour, the allocations that overlap it when it meters it. An
allocation written afterwards with a start in an hour already metered (a daemon that
recorded it late, a replay) would never be read again by hour. So every metering run first
looks at the allocations written since the last run, by metering's high-water mark on
allocation ids (`MeteringMark`: the highest id a run has seen), and meters each into every
metered hour it overlaps and has no record of, by the metering rule (billing/metering/hourly.py):

1. read the mark, and the highest allocation id now (what this run will have seen);
2. read the allocations above the mark that started before the last metered hour ended,
   and the metered hours they overlap, and their records already written;
3. in one transaction: write the missing records into their hours (the unique
   (allocation, hour) refuses a second), add them to the budgets' spend and to the hour's
   count (so the cost routes' memo sees them), propose an adjustment for each allocation
   with records in a month already closed, and move the mark.

An hour in an open month is billed as if metered on time: statements rate from the records.
A closed month's statement never changes; the late usage in it becomes an
`AdjustmentProposal` of its amount (the records rated as statements rate them), pending
until finance accepts it through the adjustment service (`proposal_accept`).

Ids are given in commit order because one writer, the daemon's leader, writes allocations
one cycle at a time; an allocation committed out of order behind the mark would be missed
here, and the reconciliation (billing/metering/gaps.py) reports it.
"""

from __future__ import annotations

from bisect import bisect_left
from collections import defaultdict
from datetime import datetime
from decimal import Decimal
from typing import Any

from django.db import transaction
from django.db.models import F, Max

from billing.budgets.spend import SpendRun, spend_metered
from billing.metering.attempts import attempt_kinds
from billing.metering.hourly import Held, Record, held_rows, record_of, write_records
from billing.models import (
    AdjustmentProposal,
    MeteringMark,
    MeteringPeriod,
    ProposalState,
    Statement,
    UsageRecord,
)
from billing.rates import rating
from billing.rates.cards import metered_until
from billing.statements.closing import statement_adjust
from billing.statements.rollup import rates_between
from common.errors import ConflictError
from scheduler.models import Allocation
from tenants import access
from tenants.models import Tenant


def late_usage_meter(*, now: datetime, spend: SpendRun | None = None) -> int:
    """Meter the allocations written since the last run into the metered hours they
    overlap (see the module's docstring); the number of records written."""
    # 1. the mark, and what this run sees
    mark = MeteringMark.objects.first() or MeteringMark.objects.create()
    top = Allocation.objects.aggregate(top=Max("id"))["top"] or 0
    until = metered_until()
    if top <= mark.allocation_id:
        return 0
    # 2. read
    late: list[Held] = []
    if until is not None:
        late = held_rows(
            Allocation.objects.filter(id__gt=mark.allocation_id, id__lte=top, started_at__lt=until)
        )
    records = _missing(late) if late else {}
    # 3. write
    with transaction.atomic():
        written = 0
        for period, rows in records.items():
            write_records(rows)
            spend_metered(period, rows, spend)
            MeteringPeriod.objects.filter(pk=period.pk).update(records=F("records") + len(rows))
            written += len(rows)
        _propose([r for rows in records.values() for r in rows], records, now)
        MeteringMark.objects.filter(pk=mark.pk).update(allocation_id=top)
    return written


def _missing(late: list[Held]) -> dict[MeteringPeriod, list[Record]]:
    """The records `late` lacks in the metered hours, per hour."""
    first = min(h.started_at for h in late)
    periods = list(MeteringPeriod.objects.filter(start__gte=_hour(first)).order_by("start"))
    starts = [period.start for period in periods]
    done = set(
        UsageRecord.objects.filter(allocation_id__in=[h.id for h in late]).values_list(
            "allocation_id", "period_id"
        )
    )
    out: dict[MeteringPeriod, list[Record]] = defaultdict(list)
    for held in late:
        # The metered hours it overlaps: from the hour it started in to the one it ended in.
        lo = bisect_left(starts, _hour(held.started_at))
        hi = len(starts) if held.ended_at is None else bisect_left(starts, held.ended_at)
        for period in periods[lo:hi]:
            if (held.id, period.pk) in done:
                continue
            record = record_of(period, held, period.start, period.end)
            if record.end > record.start:
                out[period].append(record)
    return out


def _hour(moment: datetime) -> datetime:
    return moment.replace(minute=0, second=0, microsecond=0)


def _propose(records: list[Record], periods: Any, now: datetime) -> None:
    """An adjustment proposal per allocation and closed statement that late records fall in."""
    if not records:
        return
    roots = _roots({r.tenant_id for r in records})
    closed = list(Statement.objects.filter(organisation_id__in=set(roots.values())))
    groups: dict[tuple[Statement, int], list[Record]] = defaultdict(list)
    for record in records:
        statement = next(
            (
                s
                for s in closed
                if s.organisation_id == roots[record.tenant_id]
                and s.period_start <= record.start < s.period_end
            ),
            None,
        )
        if statement is not None:
            groups[(statement, record.allocation.id)].append(record)
    for (statement, allocation_id), rows in groups.items():
        amount = _amount(rows)
        held = rows[0].allocation
        hours = len(rows)
        AdjustmentProposal.objects.get_or_create(
            statement=statement,
            allocation_id=allocation_id,
            defaults={
                "tenant_id": rows[0].tenant_id,
                "project_id": rows[0].project_id,
                "amount": amount,
                "reason": (
                    f"usage of job {held.job_id} (allocation {allocation_id}) recorded after "
                    f"the month was closed: {hours} metered hour(s) from "
                    f"{rows[0].start:%Y-%m-%dT%H:%M:%SZ}"
                ),
                "created_at": now,
            },
        )


def _roots(tenant_ids: set[int]) -> dict[int, int]:
    """tenant -> its organisation (the root of its path)."""
    paths = Tenant.objects.filter(pk__in=tenant_ids).values_list("pk", "path")
    return {pk: int(path.strip("/").split("/")[0]) for pk, path in paths}


def _amount(rows: list[Record]) -> Decimal:
    """The records rated as statements rate them (kinds by how the attempt ended), each
    line rounded once: what the statement would have held for them."""
    kinds = attempt_kinds(
        (r.allocation.id, r.allocation.job_id, r.allocation.started_at) for r in rows
    )
    usages = [
        rating.Usage(
            r.allocation.job_id,
            r.flavor,
            kinds[r.allocation.id],
            r.start,
            r.end,
            r.gpu_milli,
            r.cpu_milli,
            r.memory_mib,
            r.priority_class,
            r.borrowed,
        )
        for r in rows
    ]
    rates = rates_between(min(r.start for r in rows), max(r.end for r in rows))
    try:
        lines = rating.rate_usage(usages, rates)
    except rating.MissingRate:
        return Decimal("0.00")  # no price for it: finance decides the amount on accepting
    return sum((line.amount for line in lines), Decimal("0.00"))


def proposals_pending(user: Any) -> Any:
    """The pending proposals, for finance and platform admins."""
    access.require_books_keeper(user)
    return AdjustmentProposal.objects.filter(state=ProposalState.PENDING)


@transaction.atomic
def proposal_accept(
    *, user: Any, proposal: AdjustmentProposal, amount: Decimal | None = None
) -> AdjustmentProposal:
    """Finance accepts a proposal: its adjustment line is appended to the closed statement
    by the adjustment service (`closing.statement_adjust`: checked and audited there).
    `amount`: finance's own figure instead of the proposed one."""
    access.require_books_keeper(user)
    locked = AdjustmentProposal.objects.select_for_update().get(pk=proposal.pk)
    if locked.state != ProposalState.PENDING:
        raise ConflictError(f"proposal {locked.pk} is {locked.state} already.")
    line = statement_adjust(
        user=user,
        statement=locked.statement,
        tenant=locked.tenant,
        project=locked.project,
        amount=locked.amount if amount is None else amount,
        reason=locked.reason,
    )
    locked.state, locked.line, locked.decided_by = ProposalState.ACCEPTED, line, user
    locked.save(update_fields=["state", "line", "decided_by"])
    return locked
