"""A queued job's expected start in words ("in about 25 min (p90 1 h 10 min)"), from the
estimate and the server's time of the answer, so a client clock that is off changes nothing."""

from __future__ import annotations

from datetime import datetime
from typing import Any


def duration(seconds: float) -> str:
    """Whole minutes under an hour, hours and minutes under two days, then days and hours."""
    minutes = max(0, round(seconds / 60))
    if minutes < 60:
        return f"{minutes} min"
    hours, minutes = divmod(minutes, 60)
    if hours < 48:
        return f"{hours} h {minutes} min" if minutes else f"{hours} h"
    days, hours = divmod(hours, 24)
    return f"{days} d {hours} h" if hours else f"{days} d"


def in_about(seconds: float) -> str:
    # An estimate cannot promise better than a minute or so: a start that is due is "now".
    return "any moment now" if seconds < 90 else f"in about {duration(seconds)}"


def starts_in(queue: dict[str, Any]) -> str:
    """The `starts_in` line of `gantry job` for the queue sub-resource's answer ("" when it
    has no estimate: the `starts` line says why)."""
    if queue["estimated_at"] is None or queue["eta_p50"] is None:
        return ""
    now = _time(queue["now"])
    words = in_about((_time(queue["eta_p50"]) - now).total_seconds())
    p90 = queue["eta_p90"]
    if p90 is None:
        return f"{words} (p90 later)"
    return f"{words} (p90 {duration((_time(p90) - now).total_seconds())})"


def _time(value: str) -> datetime:
    return datetime.fromisoformat(value)
