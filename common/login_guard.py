"""Slow down password guessing, on the portal's login and the API's token endpoint alike.

Failures are counted in the cache per (username, client address) and per client address alone.
Past `PER_ACCOUNT` failures for one account from one address, or `PER_ADDRESS` failures from
one address over any accounts (spraying), that address is refused for `WINDOW_S` seconds from
the last failure, even with the right password: a correct guess during a lockout teaches the
attacker nothing. A success clears the account counter and counts for nothing else, so a
script that logs in often is never locked out. Every failure and refusal is logged with the
username and the address.

The client address is the direct peer's, unless that peer is one of the trusted proxies of
`GANTRY_TRUSTED_PROXIES` (the one place they are configured); see `client_address`.

Why not django-axes (weighed for issue 17): its one failure limit applies to every lockout key,
so it cannot lock one account after 5 failures and an address after 30 over many accounts
without locking a whole office behind one NAT after 5; it records attempts through a global
authentication backend and its middleware, which the API's token view (DRF wraps the request
that reaches `authenticate`) needs extra glue to honour; and it adds a table written on every
failed login. What the portal and the API need is these few cache keys, shared by both.
"""

from __future__ import annotations

import hashlib
import ipaddress
import logging
from collections.abc import Iterable

from django.conf import settings
from django.core.cache import cache
from django.core.exceptions import ImproperlyConfigured
from django.http import HttpRequest

PER_ACCOUNT = 5
PER_ADDRESS = 30
WINDOW_S = 15 * 60

Network = ipaddress.IPv4Network | ipaddress.IPv6Network


def parse_trusted_proxies(entries: Iterable[str]) -> tuple[Network, ...]:
    """`["10.0.0.0/8", "192.0.2.7"]` -> networks; anything else is a configuration error."""
    networks = []
    for entry in entries:
        try:
            networks.append(ipaddress.ip_network(entry.strip(), strict=False))
        except ValueError:
            raise ImproperlyConfigured(
                f"GANTRY_TRUSTED_PROXIES: {entry!r} is not an IP address or network "
                "(e.g. 10.0.0.0/8); it lists the proxies in front of Gantry, not their number."
            ) from None
    return tuple(networks)


def _address(text: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    try:
        return ipaddress.ip_address(text.strip())
    except ValueError:
        return None


def _trusted(address: ipaddress.IPv4Address | ipaddress.IPv6Address | None) -> bool:
    proxies = parse_trusted_proxies(getattr(settings, "GANTRY_TRUSTED_PROXIES", ()))
    return address is not None and any(address in network for network in proxies)


def client_address(request: HttpRequest) -> str:
    """The client's address as the counters see it.

    X-Forwarded-For is written by whoever sent the request, so it is read only when the direct
    peer (REMOTE_ADDR) is a trusted proxy. Then the header is walked from the right, past every
    trusted proxy, and the first address that is not one is the client: each trusted proxy
    appended the address it saw, and anything left of that is the client's own claim.
    """
    peer = str(request.META.get("REMOTE_ADDR") or "unknown")
    if not _trusted(_address(peer)):
        return peer
    hops = [h.strip() for h in request.META.get("HTTP_X_FORWARDED_FOR", "").split(",")]
    client = peer
    for hop in reversed([h for h in hops if h]):
        address = _address(hop)
        if address is None:  # not written by a proxy we trust: keep the last trusted hop
            break
        client = str(address)
        if not _trusted(address):
            break
    return client


def _key(*parts: str) -> str:
    digest = hashlib.sha256("\x00".join(parts).encode()).hexdigest()[:32]
    return f"login-fail:{digest}"


def _keys(username: str, address: str) -> tuple[str, str]:
    return _key("account", username.strip().lower(), address), _key("address", address)


def _log(surface: str) -> logging.Logger:
    return logging.getLogger(f"gantry.{surface.lower()}.login")


def is_locked(username: str, address: str) -> bool:
    account_key, address_key = _keys(username, address)
    counts = cache.get_many([account_key, address_key])
    return counts.get(account_key, 0) >= PER_ACCOUNT or counts.get(address_key, 0) >= PER_ADDRESS


def record_failure(username: str, address: str, *, surface: str = "portal") -> None:
    for key in _keys(username, address):
        # add() then incr() keeps the counter atomic on Redis; touch() restarts the window.
        cache.add(key, 0, WINDOW_S)
        try:
            cache.incr(key)
        except ValueError:  # expired between add and incr
            cache.set(key, 1, WINDOW_S)
        cache.touch(key, WINDOW_S)
    _log(surface).warning("failed %s login for %r from %s", surface, username[:150], address)


def record_refusal(username: str, address: str, *, surface: str = "portal") -> None:
    _log(surface).warning(
        "%s login refused (too many failures) for %r from %s", surface, username[:150], address
    )


def record_success(username: str, address: str) -> None:
    cache.delete(_keys(username, address)[0])
