"""Allowances on the background runs a person starts (what-if replays, finance exports): one
at a time per person, and a number a day. Each run holds a worker of the `reports` queue for
up to its time limit, so what one person may start is bounded, and a refusal says when to try
again (RateLimitedError: a 429 with Retry-After in the API).

The day is a sliding 24 hours: the allowance comes back one run at a time, 24 hours after each
run was started, not all at once at midnight.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from django.db.models import QuerySet

from common.errors import RateLimitedError

DAY = timedelta(days=1)
# What a person waiting for their own run is told to wait before asking again: runs report
# their progress every few seconds, and most end within minutes.
BUSY_RETRY_S = 30


def runs_allowed(
    *,
    active: QuerySet[Any],
    started: QuerySet[Any],
    per_day: int,
    now: datetime,
    noun: str,
    whose: str,
) -> None:
    """Raise RateLimitedError when `active` (this person's queued or running runs) holds one,
    or when `started` (the runs counted against the same allowance, with a `created_at`)
    holds `per_day` or more started within the last 24 hours. `noun` names a run ("what-if
    run"), `whose` the allowance ("team-alpha's")."""
    busy = active.order_by("created_at").values_list("pk", flat=True).first()
    if busy is not None:
        raise RateLimitedError(
            f"Your {noun} #{busy} is still queued or running; one at a time: start this one "
            "once it has finished.",
            retry_after_s=BUSY_RETRY_S,
        )
    recent = started.filter(created_at__gt=now - DAY).order_by("-created_at")
    times = list(recent.values_list("created_at", flat=True)[:per_day])
    if len(times) >= per_day:
        # The oldest of the last `per_day` runs leaves the window first.
        free_at = times[-1] + DAY
        raise RateLimitedError(
            f"{whose} allowance of {per_day} {noun}s a day is spent; the next one may start "
            f"at {free_at:%Y-%m-%d %H:%M} UTC.",
            retry_after_s=int((free_at - now).total_seconds()) + 1,
        )
