"""Template helpers of the what-if pages and the link to them."""

from __future__ import annotations

from typing import Any

from django import template

from whatif.runs import may_use_whatif

register = template.Library()


@register.filter
def wait(seconds: float | None) -> str:
    """A wait: '—' for none (the job never started), else hours and minutes (0m for none)."""
    if seconds is None:
        return "—"
    hours, rest = divmod(int(seconds), 3600)
    return f"{hours}h {rest // 60:02d}m" if hours else f"{rest // 60}m"


@register.filter
def may_whatif(user: Any) -> bool:
    return bool(user.is_authenticated) and may_use_whatif(user)
