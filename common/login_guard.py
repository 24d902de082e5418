"""Slow down password guessing, on the portal's login and the API's token endpoint alike.

Three counters, in the cache, shared by both surfaces:
- per (username, client address): past `PER_ACCOUNT` failures, that address is refused for
  that account for `WINDOW_S` seconds from the last failure;
- per client address over any accounts (spraying): past `PER_ADDRESS`, the address is refused;
- per account, whatever the address: past `ACCOUNT_FREE` failures, every further attempt for
  the account waits for a delay that doubles with each failure from `BACKOFF_BASE_S` up to
  `BACKOFF_CAP_S` after the last one, and one attempt at a time takes the slot that opens. The
  client address is what a client may fake (a trusted proxy's X-Forwarded-For, many hosts), so
  this counter is what bounds guessing: one try per `BACKOFF_CAP_S` per account at most. It
  slows down, it never bans: the account's owner waits at most `BACKOFF_CAP_S` for a slot.

A refusal applies even to the right password (a correct guess during a lockout teaches the
attacker nothing) and is not counted as a failure. A success clears the account's counters,
so a script that logs in often is never slowed down. Every failure and refusal is logged with
the username and the address.

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
import math
import time
from collections.abc import Iterable
from dataclasses import dataclass

from django.conf import settings
from django.core.cache import cache
from django.core.exceptions import ImproperlyConfigured
from django.http import HttpRequest

from common.words import counted, minutes

PER_ACCOUNT = 5
PER_ADDRESS = 30
WINDOW_S = 15 * 60
# The account-wide backoff: ACCOUNT_FREE failures (a user's own typos) cost nothing; then the
# delay doubles from BACKOFF_BASE_S to BACKOFF_CAP_S (2, 4, ... 256, then 300 s). An account's
# failures are forgotten ACCOUNT_MEMORY_S after the last one. A claimed slot whose attempt never
# reported back (a crashed request) opens again after CLAIM_S.
ACCOUNT_FREE = 10
BACKOFF_BASE_S = 2.0
BACKOFF_CAP_S = 300.0
ACCOUNT_MEMORY_S = 24 * 3600
CLAIM_S = 10

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


def clock() -> float:
    """The account backoff's clock (seconds); tests replace it to pass a delay without sleeping."""
    return time.time()


def _keys(username: str, address: str) -> tuple[str, str]:
    return _key("account", _account(username), address), _key("address", address)


def _account(username: str) -> str:
    return username.strip().lower()


def _account_keys(username: str) -> tuple[str, str]:
    """(failures of the account from anywhere, the time before which it is refused)."""
    return _key("account-any", _account(username)), _key("account-until", _account(username))


def backoff_s(failures: int) -> float:
    """How long an account with `failures` failures in a row waits after the last one."""
    if failures < ACCOUNT_FREE:
        return 0.0
    return min(BACKOFF_CAP_S, BACKOFF_BASE_S * 2 ** min(failures - ACCOUNT_FREE, 32))


def _log(surface: str) -> logging.Logger:
    return logging.getLogger(f"gantry.{surface.lower()}.login")


@dataclass(frozen=True)
class Refusal:
    """Why an attempt is refused before its password is checked, and for how long."""

    wait_s: int
    account_wide: bool  # the account's backoff, not this address's lock

    def message(self, attempts: str = "logins") -> str:
        where = "" if self.account_wide else " from your address"
        wait = counted(self.wait_s, "second") if self.wait_s < 120 else minutes(self.wait_s)
        return f"Too many failed {attempts} for this account{where}. Wait {wait}, then try again."


def refusal(username: str, address: str) -> Refusal | None:
    """Whether an attempt for `username` from `address` is refused now (None: go ahead).

    Called once per attempt, before the password is checked: when the account's backoff has
    passed, this attempt takes the slot that opened, and concurrent attempts are refused until
    it reports its outcome (`record_failure`, `record_success`)."""
    account_key, address_key = _keys(username, address)
    until_key = _account_keys(username)[1]
    values = cache.get_many([account_key, address_key, until_key])
    if values.get(account_key, 0) >= PER_ACCOUNT or values.get(address_key, 0) >= PER_ADDRESS:
        return Refusal(wait_s=WINDOW_S, account_wide=False)
    until = values.get(until_key)
    if until is None:
        return None
    now = clock()
    if now < until:
        return Refusal(wait_s=max(1, math.ceil(until - now)), account_wide=True)
    if cache.add(_key("account-slot", _account(username), repr(until)), 1, CLAIM_S):
        return None
    return Refusal(wait_s=1, account_wide=True)  # another attempt holds the slot


def _incr(key: str, timeout: float) -> int:
    # add() then incr() keeps the counter atomic on Redis; touch() restarts the window.
    cache.add(key, 0, timeout)
    try:
        count = cache.incr(key)
    except ValueError:  # expired between add and incr
        cache.set(key, 1, timeout)
        count = 1
    cache.touch(key, timeout)
    return int(count)


def record_failure(username: str, address: str, *, surface: str = "portal") -> None:
    for key in _keys(username, address):
        _incr(key, WINDOW_S)
    any_key, until_key = _account_keys(username)
    delay = backoff_s(_incr(any_key, ACCOUNT_MEMORY_S))
    if delay:
        cache.set(until_key, clock() + delay, ACCOUNT_MEMORY_S)
    _log(surface).warning("failed %s login for %r from %s", surface, username[:150], address)


def record_refusal(username: str, address: str, *, surface: str = "portal") -> None:
    _log(surface).warning(
        "%s login refused (too many failures) for %r from %s", surface, username[:150], address
    )


def record_success(username: str, address: str) -> None:
    cache.delete_many([_keys(username, address)[0], *_account_keys(username)])
