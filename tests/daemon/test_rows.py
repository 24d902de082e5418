"""The job columns as the daemon reads them (`scheduler.snapshot.rows`): times read through
a raw cursor made aware, whatever the database gives (SQLite gives text or naive times): the
daemon once compared SQLite's naive time with an aware one and stopped for good (issue 17,
point 1)."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from scheduler.snapshot.rows import aware


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ("2026-12-03 21:00:00.250000", datetime(2026, 12, 3, 21, 0, 0, 250000, tzinfo=UTC)),
        (datetime(2026, 12, 3, 21, 0), datetime(2026, 12, 3, 21, 0, tzinfo=UTC)),
        (datetime(2026, 12, 3, 21, 0, tzinfo=UTC), datetime(2026, 12, 3, 21, 0, tzinfo=UTC)),
    ],
    ids=["sqlite-text", "naive", "aware"],
)
def test_raw_cursor_times_are_made_aware(raw: datetime | str, expected: datetime) -> None:
    assert aware(raw) == expected and aware(raw).tzinfo is not None
