"""The installation's currency: one ISO 4217 code, checked against pycountry's list.

Imported by the settings (no Django here), so that a wrong code stops the process at start
instead of printing it on every statement.
"""

from __future__ import annotations

import pycountry

# Codes ISO 4217 assigns to "no currency" and to testing: no price can be in them.
NOT_MONEY = frozenset({"XXX", "XTS"})


def validate_currency(code: str) -> str:
    """`code` upper-cased when it is an ISO 4217 currency code; ValueError otherwise."""
    normalized = code.strip().upper()
    if (
        len(normalized) != 3
        or normalized in NOT_MONEY
        or pycountry.currencies.get(alpha_3=normalized) is None
    ):
        raise ValueError(f"{code!r} is not an ISO 4217 currency code (such as EUR or USD).")
    return normalized
