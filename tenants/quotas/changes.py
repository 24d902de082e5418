"""A quota change that names some of a quota's values: the others stay as the quota has them.

A quota request carries only the fields it names (issue 38): approving it changes those and
keeps the others as they are at approval time, read under `quota_set`'s lock on the row, so
a weight set between the request and its approval is not undone by it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, fields
from typing import Any

from django.core.exceptions import ValidationError

from tenants.models import Quota
from tenants.quotas.rules import QuotaValues

# The fields a change may name, in the order people read them.
FIELDS = tuple(f.name for f in fields(QuotaValues))
# What a new quota has for a field a change leaves out; None: it must be named.
NEW_QUOTA: dict[str, Any] = {
    "guaranteed_milli": None,
    "limit_milli": None,
    "lend_limit_milli": None,
    "weight": 1.0,
    "user_limit_milli": None,
}
_REQUIRED_NEW = ("guaranteed_milli", "limit_milli")

# A change: field -> its new value, only the fields named.
QuotaChange = Mapping[str, Any]


def change_of(values: QuotaValues | QuotaChange) -> dict[str, Any]:
    """The named fields: a QuotaValues names all of them. ValidationError when none is named
    or a name is not a quota field."""
    named = asdict(values) if isinstance(values, QuotaValues) else dict(values)
    unknown = sorted(set(named) - set(FIELDS))
    if unknown:
        raise ValidationError({name: ["not a quota value."] for name in unknown})
    if not named:
        raise ValidationError(
            {"non_field_errors": [f"name at least one of {', '.join(FIELDS)} to change."]}
        )
    return named


def values_of(quota: Quota | None) -> dict[str, Any] | None:
    """The quota's values by field, or None without a quota."""
    if quota is None:
        return None
    return {name: getattr(quota, name) for name in FIELDS}


def values_with(quota: Quota | None, change: QuotaChange) -> QuotaValues:
    """The quota's values with `change` applied. Without a quota, the guarantee and the limit
    must be named (a ValidationError naming those left out); the other fields take a new
    quota's defaults."""
    current = values_of(quota)
    if current is None:
        missing = [name for name in _REQUIRED_NEW if name not in change]
        if missing:
            raise ValidationError(
                {name: ["required: there is no quota yet to keep it from."] for name in missing}
            )
        current = dict(NEW_QUOTA)
    merged = {**current, **change}
    merged["weight"] = float(merged["weight"])  # a Decimal column
    return QuotaValues(**merged)


def changes_shown(quota: Quota | None, change: QuotaChange) -> list[dict[str, Any]]:
    """The named fields as the approver and the audit read them: field, old (None without a
    quota), new; in FIELDS' order."""
    current = values_of(quota) or {}
    old = {k: float(v) if k == "weight" and v is not None else v for k, v in current.items()}
    return [
        {"field": name, "old": old.get(name), "new": change[name]}
        for name in FIELDS
        if name in change
    ]
