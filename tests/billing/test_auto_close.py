"""The month closes itself: once metered completely and GANTRY_BILLING_CLOSE_AFTER_H over,
for every organisation, once. The clock is injected (`now`)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from billing.closing import months_close_due, previous_month
from billing.metering import meter_usage
from billing.models import Statement
from tenants.models import AuditEntry
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
    settings.GANTRY_BILLING_CLOSE_AFTER_H = 2
    # Metered up to 22:00 on the last day only: the month's last hours are missing.
    cluster(org, metered_at=FEB - timedelta(hours=1, minutes=50))
    assert months_close_due(now=FEB + timedelta(hours=5)) == []
    assert not Statement.objects.exists()
    meter_usage(now=FEB + timedelta(hours=5))
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
