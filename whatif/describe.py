"""A what-if's proposed change in words, each figure with its own unit: GPU amounts (stored
in milli-GPU) in GPUs, a quota's weight as a bare weight (fair-share weights have no unit),
a priority class's value as a value, a demand scale as a factor. Pure: a stored
change (`whatif.proposal`, `whatif.inventory`) in, a sentence out."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

# A quota change's fields in the order shown: (field, its words, whether it is in milli-GPU,
# the words for null: a nullable field set to none, which is not the same as leaving it out).
QUOTA_WORDS = (
    ("guaranteed_milli", "guaranteed", True, ""),
    ("limit_milli", "limit", True, ""),
    ("lend_limit_milli", "lends at most", True, "lends all its guarantee"),
    ("user_limit_milli", "one user at most", True, "no cap per user"),
    ("weight", "weight", False, ""),
)


def _gpus(milli: int) -> str:
    return f"{milli / 1000:g} GPUs"


def _quota(change: Mapping[str, Any]) -> str:
    where = f"{change['tenant']}, {change['flavor']}"
    if change.get("cluster"):
        where += f" on {change['cluster']}"
    figures = []
    for field, words, in_milli, when_null in QUOTA_WORDS:
        if field not in change:  # left out: today's value is kept
            continue
        value = change[field]
        if value is None:
            figures.append(when_null)
        else:
            figures.append(f"{words} {_gpus(value) if in_milli else format(value, 'g')}")
    return f"{where}: {', '.join(figures)}"


def _inventory(change: Mapping[str, Any]) -> str:
    words = f"{change['action']} {change['gpus']} GPUs of {change['flavor']}"
    if change["action"] == "move":
        words += f" from pool {change.get('from_pool')} to pool {change.get('to_pool')}"
    return words


def change_describe(change: Mapping[str, Any]) -> str:
    """One change in words, e.g. "team-bravo, H100-80GB: limit 24 GPUs, weight 2"."""
    kind = change["kind"]
    if kind == "quota":
        return _quota(change)
    if kind == "inventory":
        return _inventory(change)
    if kind == "demand":
        return (
            f"{change['flavor']}'s demand forecast {change['at_day']} days ahead: the "
            f"window's jobs \u00d7{change['scale']:g}"
        )
    return f"priority class {change['name']}: value {change['value']}"
