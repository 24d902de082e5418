"""Counts in words, for every text a person reads: "1 minute", "2 minutes", "1 try".

The one place that decides singular or plural, so that no message says "1 minutes" (a
template says the same with Django's `pluralize`).
"""

from __future__ import annotations

# Units whose plural is not the singular with an "s".
IRREGULAR = {"try": "tries", "retry": "retries", "entry": "entries"}


def counted(n: float, unit: str) -> str:
    """`n` followed by `unit`, singular for exactly 1: counted(1, "minute") -> "1 minute"."""
    number = f"{n:g}" if isinstance(n, float) else str(n)
    if n == 1:
        return f"{number} {unit}"
    return f"{number} {IRREGULAR.get(unit, unit + 's')}"


def minutes(seconds: float) -> str:
    """A duration in whole minutes, rounded: minutes(60) -> "1 minute"."""
    return counted(round(seconds / 60), "minute")
