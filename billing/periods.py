"""Calendar periods in UTC: the one home of month arithmetic (statements, budgets, costs,
exports and the portal's month pickers all count months the same way)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta


def month_start(at: datetime) -> datetime:
    """The first instant (UTC) of the month `at` falls in."""
    return at.astimezone(UTC).replace(day=1, hour=0, minute=0, second=0, microsecond=0)


def month_end(month: datetime) -> datetime:
    """The first instant of the month after the one that starts at `month` (a month start)."""
    return month.replace(year=month.year + month.month // 12, month=month.month % 12 + 1)


def next_month(at: datetime) -> datetime:
    """The first instant (UTC) of the month after the one `at` falls in."""
    return month_end(month_start(at))


def month_bounds(text: str) -> tuple[datetime, datetime]:
    """ "2031-01" -> (2031-01-01T00:00Z, 2031-02-01T00:00Z); ValueError when malformed."""
    year, month = (int(part) for part in text.split("-", 1))
    start = datetime(year, month, 1, tzinfo=UTC)
    return start, month_end(start)


def previous_month(now: datetime) -> tuple[datetime, datetime]:
    """The bounds of the month (UTC) before the one `now` is in."""
    end = month_start(now)
    return month_start(end - timedelta(days=1)), end


def month_starts(last: datetime, count: int) -> list[datetime]:
    """The first instants of the `count` months ending with `last`'s, oldest first."""
    starts = [month_start(last)]
    for _ in range(count - 1):
        starts.append(month_start(starts[-1] - timedelta(days=1)))
    return starts[::-1]
