"""billing/periods.py: the one home of month arithmetic, in UTC (issue 36: it was written three
times, and the API's copy did not convert to UTC)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone

import pytest

from billing.periods import (
    month_bounds,
    month_end,
    month_start,
    month_starts,
    next_month,
    previous_month,
)

TOKYO = timezone(timedelta(hours=9))


def test_a_moment_counts_in_the_utc_month_it_falls_in() -> None:
    # 1 February 08:00 in Tokyo is still 31 January in UTC.
    moment = datetime(2031, 2, 1, 8, 0, tzinfo=TOKYO)
    assert month_start(moment) == datetime(2031, 1, 1, tzinfo=UTC)
    assert next_month(moment) == datetime(2031, 2, 1, tzinfo=UTC)


def test_december_ends_in_january_of_the_next_year() -> None:
    assert month_end(datetime(2031, 12, 1, tzinfo=UTC)) == datetime(2032, 1, 1, tzinfo=UTC)
    assert month_bounds("2031-12") == (
        datetime(2031, 12, 1, tzinfo=UTC),
        datetime(2032, 1, 1, tzinfo=UTC),
    )
    assert previous_month(datetime(2032, 1, 15, tzinfo=UTC)) == month_bounds("2031-12")


def test_month_starts_cross_the_year_oldest_first() -> None:
    assert month_starts(datetime(2032, 2, 10, tzinfo=UTC), 4) == [
        datetime(2031, 11, 1, tzinfo=UTC),
        datetime(2031, 12, 1, tzinfo=UTC),
        datetime(2032, 1, 1, tzinfo=UTC),
        datetime(2032, 2, 1, tzinfo=UTC),
    ]


@pytest.mark.parametrize("text", ["2031", "2031-13", "x-01", ""])
def test_a_malformed_month_is_a_value_error(text: str) -> None:
    with pytest.raises(ValueError):
        month_bounds(text)
