"""Approval inbox and history (filled in when the approval workflow lands)."""

from __future__ import annotations

from typing import Any


def inbox_for(user: Any) -> list[Any] | None:
    return None
