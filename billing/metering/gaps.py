"""The reconciliation of allocations against usage records, on a schedule (Celery beat).

Every allocation that held something during a metered hour has one usage record for it (the
metering rule: billing/metering/hourly.py; late ones: billing/metering/late.py). This check looks
for (allocation, metered hour) pairs without one over a window of metered hours, records the
result (`UsageCheck`, shown on /metrics as `gantry_billing_usage_gaps`) and logs at error
level when there is any: usage that nobody would bill. It reads and changes nothing else.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from datetime import datetime, timedelta
from typing import Any

from django.db import connection
from prometheus_client.core import GaugeMetricFamily

from billing.models import UsageCheck
from billing.periods import month_start

logger = logging.getLogger(__name__)

# The allocations named in a check's result (the count covers them all).
NAMED = 20

# An allocation overlapping a metered hour for a positive time, without its record: the
# metering rule's overlap (an allocation not ended holds to the end of the hour).
_GAPS = """
SELECT a.id, p.start FROM scheduler_allocation a
JOIN billing_meteringperiod p
  ON a.started_at < p."end" AND p.start < COALESCE(a.ended_at, p."end")
 AND a.started_at < COALESCE(a.ended_at, p."end")
WHERE p.start >= %s AND p.start < %s AND a.started_at < %s
  AND (a.ended_at IS NULL OR a.ended_at > %s)
  AND NOT EXISTS (
    SELECT 1 FROM billing_usagerecord u WHERE u.allocation_id = a.id AND u.period_id = p.id
  )
ORDER BY a.id, p.start
"""


def usage_gaps(start: datetime, end: datetime) -> list[tuple[int, datetime]]:
    """(allocation id, hour) of every metered hour in [start, end) that an allocation held
    something in and has no usage record of."""
    adapt = connection.ops.adapt_datetimefield_value
    with connection.cursor() as cursor:
        cursor.execute(_GAPS, [adapt(start), adapt(end), adapt(end), adapt(start)])
        return [(allocation, hour) for allocation, hour in cursor.fetchall()]


def usage_check(*, now: datetime, start: datetime | None = None) -> UsageCheck:
    """Check the metered hours from `start` (by default the start of the previous month:
    the month that may still be closing and the open one) to `now`; record and log it."""
    if start is None:
        start = month_start(month_start(now) - timedelta(days=1))
    gaps = usage_gaps(start, now)
    allocations = sorted({allocation for allocation, _ in gaps})
    check = UsageCheck.objects.create(
        checked_at=now, start=start, end=now, gaps=len(gaps), allocations=allocations[:NAMED]
    )
    if gaps:
        logger.error(
            "usage not metered: %s allocation-hour(s) without a usage record since %s, "
            "allocations %s",
            len(gaps),
            f"{start:%Y-%m-%dT%H:%MZ}",
            allocations[:NAMED],
        )
    else:
        logger.info("usage reconciled with the allocations since %s", f"{start:%Y-%m-%dT%H:%MZ}")
    return check


def usage_check_families() -> Iterator[Any]:
    """/metrics: the last check's gaps (0 when none ran yet) and when it ran."""
    last = UsageCheck.objects.order_by("-checked_at", "-id").first()
    gaps = GaugeMetricFamily(
        "gantry_billing_usage_gaps",
        "Allocation-hours without a usage record at the last reconciliation (alert above 0).",
    )
    gaps.add_metric([], last.gaps if last else 0)
    checked = GaugeMetricFamily(
        "gantry_billing_usage_checked_timestamp_seconds",
        "When allocations were last reconciled against usage records (Unix time).",
    )
    checked.add_metric([], last.checked_at.timestamp() if last else 0)
    yield gaps
    yield checked
