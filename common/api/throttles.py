"""API rate limits (DRF throttling): 429 with Retry-After once a window's requests are spent.

Every API request by a person counts twice: against its user (`user`: the portal's session
and all of the user's tokens together) and, when it comes with a token, against that token
(`token`: each token its own window, so one runaway script does not spend its owner's whole
allowance and a leaked token is held to its own; DRF keeps one token per user, so today that
is the user's token, and the user's window still binds it). Anonymous requests count by
client address (`anon`; `common.login_guard.client_address`, which trusts X-Forwarded-For
only from the configured proxies). Submissions count once more, per user (`submit`), and a
node agent's GPU reports count per agent account, that is per node (`agent`), apart from
everything else, so a cluster's agents never spend one another's allowance. The token
endpoint's attempts count per client address (`login`), next to the login guard's failure
counters (common/login_guard.py), successful or not. The rates are
settings (GANTRY_THROTTLE_*, README) in DRF's form "N/period".

The counts live in the `throttle` cache (config/settings.py): Redis when REDIS_URL is set,
else a file cache under GANTRY_VAR_DIR, so every web process of a host shares one window.
DRF's throttle reads the window, then writes it back: two requests at the same instant may
both pass the last slot, so a burst can exceed a limit by about the number of concurrent
requests. That is accepted here: the limits are there to stop a runaway client, not to count
exactly.
"""

from __future__ import annotations

import hashlib
import time
from typing import Any

from django.core.cache import BaseCache, caches
from rest_framework.authtoken.models import Token
from rest_framework.request import Request
from rest_framework.settings import api_settings
from rest_framework.throttling import SimpleRateThrottle

from common import login_guard

CACHE_ALIAS = "throttle"


class GantryThrottle(SimpleRateThrottle):
    """A DRF rate throttle whose rate, cache and clock are read when it is used, so that a
    changed setting or a test's injected clock applies without a reload."""

    cache_format = "throttle:%(scope)s:%(ident)s"

    @property
    def cache(self) -> BaseCache:  # type: ignore[override]
        return caches[CACHE_ALIAS]

    def timer(self) -> float:  # type: ignore[override]
        return clock()

    def get_rate(self) -> str | None:
        rate = api_settings.DEFAULT_THROTTLE_RATES.get(self.scope or "")
        return None if rate is None else str(rate)

    def keyed(self, ident: str) -> str:
        return self.cache_format % {"scope": self.scope, "ident": ident}


def clock() -> float:
    """The throttles' clock (seconds); tests replace it to move a window without sleeping."""
    return time.time()


class UserThrottle(GantryThrottle):
    """Per user, across the session and every token."""

    scope = "user"

    def get_cache_key(self, request: Request, view: Any) -> str | None:
        return self.keyed(f"u{request.user.pk}") if request.user.is_authenticated else None


class AnonymousThrottle(GantryThrottle):
    """Anonymous requests, per client address."""

    scope = "anon"

    def get_cache_key(self, request: Request, view: Any) -> str | None:
        if request.user.is_authenticated:
            return None
        return self.keyed(login_guard.client_address(request._request))


class TokenThrottle(GantryThrottle):
    """Per API token; requests without one (a session, anonymous) are not its to count."""

    scope = "token"

    def get_cache_key(self, request: Request, view: Any) -> str | None:
        if not isinstance(request.auth, Token):
            return None
        # The key is a credential: the cache (Redis, files) keeps only its digest.
        return self.keyed(hashlib.sha256(request.auth.key.encode()).hexdigest()[:32])


class SubmitThrottle(GantryThrottle):
    """Job submissions per user, on top of the user's and token's limits."""

    scope = "submit"

    def get_cache_key(self, request: Request, view: Any) -> str | None:
        return self.keyed(f"u{request.user.pk}") if request.user.is_authenticated else None


class AgentThrottle(GantryThrottle):
    """A node agent's reports, per agent account (one per node): sized for one node's
    reporting interval, whatever the size of the cluster."""

    scope = "agent"

    def get_cache_key(self, request: Request, view: Any) -> str | None:
        return self.keyed(f"u{request.user.pk}") if request.user.is_authenticated else None


class LoginThrottle(GantryThrottle):
    """Attempts at `POST /api/v1/auth/token/`, per client address, whatever their outcome."""

    scope = "login"

    def get_cache_key(self, request: Request, view: Any) -> str | None:
        return self.keyed(login_guard.client_address(request._request))
