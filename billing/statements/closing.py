"""Closing a period freezes an organisation's statement; corrections are adjustment lines.

`statement_close` is idempotent and safe to run concurrently: the statement row is unique per
(organisation, period) and is written with all its lines in one transaction, so a second or
concurrent close finds it (waiting on PostgreSQL for the first to commit) and returns it.
"""

from __future__ import annotations

import logging
from datetime import datetime, timedelta
from decimal import Decimal
from typing import Any

from django.conf import settings
from django.core.exceptions import ValidationError
from django.db import IntegrityError, transaction
from django.db.models import Min
from django.utils import timezone

from billing.metering.hourly import HOUR, floor_hour, meter_caught_up
from billing.models import LineKind, MeteringPeriod, Statement, StatementLine, StatementSeal
from billing.periods import previous_month
from billing.statements.rollup import DraftLine, organisation_lines
from common.errors import DomainError
from scheduler.models import Allocation
from tenants import access
from tenants.audit import audit_record
from tenants.models import Project, Tenant

logger = logging.getLogger(__name__)


def months_close_due(*, now: datetime) -> list[Statement]:
    """Close the previous month for every organisation, once it has been over for
    GANTRY_BILLING_CLOSE_AFTER_H hours and is metered completely (the Celery beat task).

    Idempotent: an organisation whose statement is closed already keeps it, so two beats or
    a rerun change nothing. An organisation that cannot be closed (a flavor without a rate)
    is logged and left for the next run; the others are closed. Returns the statements this
    run closed; each close is audited (`statement.close`, by no user: the system)."""
    start, end = previous_month(now)
    if now < end + timedelta(hours=settings.GANTRY_BILLING_CLOSE_AFTER_H):
        return []
    done = set(
        Statement.objects.filter(period_start=start, period_end=end).values_list(
            "organisation_id", flat=True
        )
    )
    due = [o for o in Tenant.objects.filter(parent__isnull=True).order_by("pk") if o.pk not in done]
    if not due:
        return []
    # Everything due first, however many hours (a metering run stops after a week of them).
    meter_caught_up(now=now, progress=_log_progress)
    try:
        _check_period(start, end, now)
    except DomainError as waiting:
        logger.info("month from %s not closed yet: %s", f"{start:%Y-%m}", waiting)
        return []
    closed = []
    for organisation in due:
        try:
            statement = statement_close(
                user=None, organisation=organisation, start=start, end=end, now=now
            )
        except DomainError as error:
            logger.error("month %s of %s not closed: %s", f"{start:%Y-%m}", organisation, error)
            continue
        logger.info(
            "closed month %s of %s: statement %s", f"{start:%Y-%m}", organisation, statement.pk
        )
        closed.append(statement)
    return closed


def _log_progress(done: int, due: int) -> None:
    logger.info("metering before the close: %s of %s hour(s) due metered", done, due)


def _check_period(start: datetime, end: datetime, now: datetime) -> None:
    if start != floor_hour(start) or end != floor_hour(end) or end <= start:
        raise ValidationError({"period": ["whole hours (UTC), the end after the start."]})
    _check_metered_range(start, end, now)
    first = Allocation.objects.aggregate(first=Min("started_at"))["first"]
    hour = max(start, floor_hour(first)) if first is not None else end
    metered = set(
        MeteringPeriod.objects.filter(start__gte=hour, start__lt=end).values_list(
            "start", flat=True
        )
    )
    missing = None
    while hour < end and missing is None:
        missing = None if hour in metered else hour
        hour += HOUR
    if end > floor_hour(now) or missing is not None:
        raise DomainError(
            f"the period up to {end:%Y-%m-%dT%H:%M:%SZ} is not metered completely yet"
            + (f" (first hour missing: {missing:%Y-%m-%dT%H:%M:%SZ})." if missing else ".")
        )


def _check_metered_range(start: datetime, end: datetime, now: datetime) -> None:
    """A period is closed only within the installation's metered range: from its first
    metered hour to the current month. A month before it (`0001-01`) would close an empty
    statement nobody can correct; one after the current month has no usage yet."""
    first = MeteringPeriod.objects.aggregate(first=Min("start"))["first"]
    if first is None:
        raise DomainError("nothing has been metered yet: there is no period to close.")
    if end <= first:
        raise DomainError(
            f"the period ends before the first metered hour ({first:%Y-%m-%dT%H:%M:%SZ})."
        )
    if start > now:
        raise DomainError(f"the period starts after now ({now:%Y-%m-%dT%H:%M:%SZ}).")


def statement_close(
    *,
    user: Any,
    organisation: Tenant,
    start: datetime,
    end: datetime,
    now: datetime | None = None,
) -> Statement:
    """The closed statement of `organisation` for [start, end), made now or found made."""
    if user is not None:
        access.require_books_keeper(user)
    if organisation.parent_id is not None:
        raise ValidationError(
            {"organisation": ["statements are closed per organisation (a root)."]}
        )
    now = now or timezone.now()
    existing = Statement.objects.filter(
        organisation=organisation, period_start=start, period_end=end
    ).first()
    if existing is not None:
        return existing
    _check_period(start, end, now)
    drafts = organisation_lines(organisation, start, end)
    try:
        with transaction.atomic():
            statement = Statement.objects.create(
                organisation=organisation,
                period_start=start,
                period_end=end,
                currency=settings.GANTRY_BILLING_CURRENCY,
                closed_at=now,
                closed_by=user,
            )
            StatementLine.objects.bulk_create((_row(statement, d) for d in drafts), batch_size=2000)
            # Last: from here on the database takes no line of it but an adjustment.
            StatementSeal.objects.create(statement=statement, sealed_at=now)
            audit_record(
                actor=user,
                action="statement.close",
                tenant=organisation,
                target=statement,
                before=None,
                after={"period_start": start, "period_end": end, "lines": len(drafts)},
            )
    except IntegrityError:
        # Another close of the same period committed first: that statement stands.
        return Statement.objects.get(organisation=organisation, period_start=start, period_end=end)
    return statement


def _row(statement: Statement, draft: DraftLine) -> StatementLine:
    line = draft.line
    account: Any = line.account
    tenant_id, project_id, user_id = account
    return StatementLine(
        statement=statement,
        tenant_id=tenant_id,
        project_id=project_id,
        user_id=user_id,
        flavor=line.flavor,
        cluster=line.cluster,
        resource=line.resource,
        kind=line.kind,
        unit=line.unit,
        quantity=line.quantity,
        rate=line.rate,
        amount=line.amount,
        charged=draft.charged,
        split=draft.frozen_split(),
    )


@transaction.atomic
def statement_adjust(
    *,
    user: Any,
    statement: Statement,
    tenant: Tenant,
    amount: Decimal,
    reason: str,
    project: Project | None = None,
) -> StatementLine:
    """Append a correction to a closed statement: an adjustment line with a reason and its
    author. The statement's other lines stay as they were closed. Finance and platform
    admins only."""
    access.require_books_keeper(user)
    errors: dict[str, list[str]] = {}
    if not tenant.path.startswith(statement.organisation.path):
        errors["tenant"] = ["is not in the statement's organisation."]
    if project is not None and project.tenant_id != tenant.pk:
        errors["project"] = ["is not a project of that tenant."]
    if not reason.strip():
        errors["reason"] = ["an adjustment says why."]
    if amount != amount.quantize(Decimal("0.01")) or not amount:
        errors["amount"] = ["a non-zero amount in cents, such as -12.50."]
    if errors:
        raise ValidationError(errors)
    line = StatementLine.objects.create(
        statement=statement,
        tenant=tenant,
        project=project,
        kind=LineKind.ADJUSTMENT,
        amount=amount,
        reason=reason.strip(),
        author=user,
    )
    audit_record(
        actor=user,
        action="statement.adjust",
        tenant=tenant,
        target=line,
        before=None,
        after={"statement": statement.pk, "amount": str(amount), "reason": line.reason},
    )
    return line
