"""When metering runs, so that a page without costs can say when they appear.

Metering (billing/metering/hourly.py) meters an hour once it ended `GANTRY_METERING_DELAY_S` ago.
Celery beat runs it hourly at the minute that delay falls on (14:05 for an hour ended at
14:00 with the default 300 s), so each hour is metered as soon as it is due and the time of
the next run follows from the clock alone: no beat state to read. A missed run is caught
up by the next (each run meters every hour due).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from celery.schedules import crontab
from django.conf import settings

HOUR = timedelta(hours=1)


def metering_minute(delay_s: float) -> int:
    """The minute past each hour at which metering runs: the first whole minute at which
    the hour before is due (a delay of 300 s: minute 5; 330 s: minute 6)."""
    return math.ceil(delay_s / 60) % 60


def metering_beat_schedule(delay_s: float) -> crontab:
    """The beat schedule of `billing.tasks.meter_closed_hours` (config/settings.py)."""
    return crontab(minute=metering_minute(delay_s))


def _run_at_or_after(moment: datetime, minute: int) -> datetime:
    run = moment.replace(minute=minute, second=0, microsecond=0)
    return run if run >= moment else run + HOUR


@dataclass(frozen=True)
class MeteringTimes:
    """`next_run`: the next metering run after `now`; `hour_metered_at`: the run that meters
    the hour running at `now` (the first run once it ended and the delay passed)."""

    next_run: datetime
    hour_metered_at: datetime


def metering_times(now: datetime, delay_s: float | None = None) -> MeteringTimes:
    delay = settings.GANTRY_METERING_DELAY_S if delay_s is None else delay_s
    minute = metering_minute(delay)
    now = now.astimezone(UTC)  # beat's crontab is in UTC (CELERY_TIMEZONE)
    hour_end = now.replace(minute=0, second=0, microsecond=0) + HOUR
    return MeteringTimes(
        next_run=_run_at_or_after(now + timedelta(microseconds=1), minute),
        hour_metered_at=_run_at_or_after(hour_end + timedelta(seconds=delay), minute),
    )
