"""The month closes itself: once metered completely and GANTRY_BILLING_CLOSE_AFTER_H over,
for every organisation, once. The clock is injected (`now`)."""

from __future__ import annotations

import logging
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from io import StringIO
from typing import Any

from django.core.management import call_command

from billing.metering.hourly import MAX_HOURS_PER_RUN, hours_due, meter_usage
from billing.models import Statement
from billing.periods import previous_month
from billing.rates.cards import RatePrices, rate_card_add
from billing.statements.closing import months_close_due
from tenants.models import AuditEntry
from tests.billing.builders import hold, job_for, make_node
from tests.billing.test_statements import cluster
from tests.conftest import Org

FEB = datetime(2031, 2, 1, tzinfo=UTC)  # the cluster's hours end here, in January


def test_previous_month_bounds() -> None:
    assert previous_month(FEB + timedelta(days=3, hours=5)) == (
        datetime(2031, 1, 1, tzinfo=UTC),
        FEB,
    )
    jan = datetime(2031, 1, 15, tzinfo=UTC)
    assert previous_month(jan) == (
        datetime(2030, 12, 1, tzinfo=UTC),
        datetime(2031, 1, 1, tzinfo=UTC),
    )


def test_the_previous_month_closes_after_the_grace_once_and_audited(
    org: Org, settings: Any
) -> None:
    settings.GANTRY_BILLING_CLOSE_AFTER_H = 24
    cluster(org)
    meter_usage(now=FEB + timedelta(hours=1))
    assert months_close_due(now=FEB + timedelta(hours=23, minutes=59)) == []
    assert not Statement.objects.exists()
    closed = months_close_due(now=FEB + timedelta(hours=24))
    assert org.acme in [s.organisation for s in closed]
    statement = Statement.objects.get(organisation=org.acme)
    assert (statement.period_start, statement.period_end) == (datetime(2031, 1, 1, tzinfo=UTC), FEB)
    assert statement.closed_by is None and statement.lines.exists()
    audit = AuditEntry.objects.get(action="statement.close", target_id=str(statement.pk))
    assert audit.actor is None
    # Idempotent: the next beats close nothing more.
    assert months_close_due(now=FEB + timedelta(hours=25)) == []
    assert months_close_due(now=FEB + timedelta(hours=26)) == []
    assert Statement.objects.count() == len(closed)
    assert AuditEntry.objects.filter(action="statement.close").count() == len(closed)


def test_a_month_not_metered_completely_waits(org: Org, settings: Any) -> None:
    settings.GANTRY_BILLING_CLOSE_AFTER_H = 0
    # Metered up to 22:00 on the last day only: the month's last hours are missing, and the
    # last one ended less than the metering delay ago, so the close cannot meter it yet.
    cluster(org, metered_at=FEB - timedelta(hours=1, minutes=50))
    assert months_close_due(now=FEB + timedelta(minutes=2)) == []
    assert not Statement.objects.exists()
    # Later, the close meters what is due itself (the hourly metering need not have run).
    assert months_close_due(now=FEB + timedelta(hours=5))
    assert Statement.objects.filter(organisation=org.acme).count() == 1


def test_the_grace_is_a_setting(org: Org, settings: Any) -> None:
    settings.GANTRY_BILLING_CLOSE_AFTER_H = 0.5
    cluster(org, metered_at=FEB + timedelta(minutes=20))
    assert months_close_due(now=FEB + timedelta(minutes=29)) == []
    assert months_close_due(now=FEB + timedelta(minutes=30))


def test_the_close_task_is_scheduled(settings: Any) -> None:
    from billing.tasks import close_previous_month

    entry = settings.CELERY_BEAT_SCHEDULE["billing-close-month"]
    assert entry == {"task": close_previous_month.name, "schedule": 3600.0}


def _a_long_month(org: Org) -> None:
    """One GPU held from 2031-01-23 00:00 to 23:00 on the 31st, nothing metered: 216 hours
    due at the month's end, more than one metering run's 168 (MAX_HOURS_PER_RUN)."""
    rate_card_add(
        user=org.users["pat"],
        flavor=org.h100,
        valid_from=datetime(2030, 12, 1, tzinfo=UTC),
        prices=RatePrices(Decimal(2)),
    )
    hold(job_for(org), make_node("n1", gpus=1), -212, 3, [1000])  # at(-212): the 23rd, 00:00
    assert len(hours_due(FEB + timedelta(minutes=10), limit=None)) == 216 > MAX_HOURS_PER_RUN


def test_close_month_meters_every_hour_due_with_progress(org: Org) -> None:
    _a_long_month(org)
    out = StringIO()
    call_command(
        "close_month", "2031-01", "--now", (FEB + timedelta(minutes=10)).isoformat(), stdout=out
    )
    assert "metered 168 of 216 hour(s) due" in out.getvalue()
    assert "metered 216 of 216 hour(s) due" in out.getvalue()
    statement = Statement.objects.get(organisation=org.acme)
    # 216 GPU-hours at 2.00.
    assert sum(statement.lines.values_list("amount", flat=True)) == Decimal("432.00")


def test_the_automatic_close_meters_every_hour_due_and_logs_it(
    org: Org, settings: Any, caplog: Any
) -> None:
    settings.GANTRY_BILLING_CLOSE_AFTER_H = 24
    _a_long_month(org)
    with caplog.at_level(logging.INFO, logger="billing.statements.closing"):
        closed = months_close_due(now=FEB + timedelta(hours=24))
    assert [s.organisation for s in closed] == [org.acme]
    # The month's 216 hours and the first 23 of February's (the 24th is within the delay).
    assert "239 of 239 hour(s) due metered" in caplog.text
