"""Counts in words (issue 35, "Smaller things": "1 minutes"): one helper decides singular or
plural for every message that counts minutes, seconds, tries or times."""

from __future__ import annotations

import pytest

from common.login_guard import Refusal
from common.words import counted, minutes


@pytest.mark.parametrize(
    ("n", "unit", "expected"),
    [
        (1, "minute", "1 minute"),
        (2, "minute", "2 minutes"),
        (0, "minute", "0 minutes"),
        (1, "try", "1 try"),
        (3, "try", "3 tries"),
        (1.0, "second", "1 second"),
        (1.5, "hour", "1.5 hours"),
    ],
    ids=["one", "two", "none", "one-try", "tries", "one-as-float", "a-fraction"],
)
def test_counted(n: float, unit: str, expected: str) -> None:
    assert counted(n, unit) == expected


@pytest.mark.parametrize(
    ("seconds", "expected"),
    [(60, "1 minute"), (89, "1 minute"), (90, "2 minutes"), (1800, "30 minutes")],
)  # round half to even: 1.5 -> 2
def test_minutes(seconds: float, expected: str) -> None:
    assert minutes(seconds) == expected


def test_the_login_refusal_says_1_second() -> None:
    assert "Wait 1 second, then" in Refusal(wait_s=1, account_wide=True).message()
    assert "Wait 15 minutes, then" in Refusal(wait_s=900, account_wide=False).message()
