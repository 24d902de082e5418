"""Slow down password guessing on the portal login (FAULTS 29).

Failures are counted in the cache per (username, client address) and per client address alone.
Past `PER_ACCOUNT` failures for one account from one address, or `PER_ADDRESS` failures from
one address over any accounts (spraying), that address is refused for `WINDOW_S` seconds from
the last failure, even with the right password: a correct guess during a lockout teaches the
attacker nothing. A success clears the account counter. Every failure and refusal is logged.
"""

from __future__ import annotations

import hashlib
import logging

from django.conf import settings
from django.core.cache import cache
from django.http import HttpRequest

log = logging.getLogger("gantry.portal.login")

PER_ACCOUNT = 5
PER_ADDRESS = 30
WINDOW_S = 15 * 60


def client_address(request: HttpRequest) -> str:
    """The client's address as the counters see it.

    X-Forwarded-For is client-controlled: trusting it blindly would let an attacker pick a
    fresh counter per request. With `GANTRY_TRUSTED_PROXIES = n` (the number of proxies in
    front of Gantry, e.g. 1 for an ingress), the n-th address from the right is the one the
    outermost trusted proxy saw; with 0 (the default) only REMOTE_ADDR counts, and behind a
    proxy every client would share one address-wide counter.
    """
    proxies = int(getattr(settings, "GANTRY_TRUSTED_PROXIES", 0) or 0)
    forwarded = [a.strip() for a in request.META.get("HTTP_X_FORWARDED_FOR", "").split(",")]
    forwarded = [a for a in forwarded if a]
    if proxies > 0 and len(forwarded) >= proxies:
        return forwarded[-proxies][:64]
    return str(request.META.get("REMOTE_ADDR") or "unknown")


def _key(*parts: str) -> str:
    digest = hashlib.sha256("\x00".join(parts).encode()).hexdigest()[:32]
    return f"portal-login-fail:{digest}"


def _keys(username: str, address: str) -> tuple[str, str]:
    return _key("account", username.strip().lower(), address), _key("address", address)


def is_locked(username: str, address: str) -> bool:
    account_key, address_key = _keys(username, address)
    counts = cache.get_many([account_key, address_key])
    return counts.get(account_key, 0) >= PER_ACCOUNT or counts.get(address_key, 0) >= PER_ADDRESS


def record_failure(username: str, address: str) -> None:
    for key in _keys(username, address):
        # add() then incr() keeps the counter atomic on Redis; touch() restarts the window.
        cache.add(key, 0, WINDOW_S)
        try:
            cache.incr(key)
        except ValueError:  # expired between add and incr
            cache.set(key, 1, WINDOW_S)
        cache.touch(key, WINDOW_S)
    log.warning("failed portal login for %r from %s", username[:150], address)


def record_refusal(username: str, address: str) -> None:
    log.warning("portal login refused (too many failures) for %r from %s", username[:150], address)


def record_success(username: str, address: str) -> None:
    cache.delete(_keys(username, address)[0])
