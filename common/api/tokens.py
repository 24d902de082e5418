"""API tokens that expire, and their rotation.

DRF's `Token` (one per user) is kept, and its `created` is its birth: a person's token is
refused with 401 once `created + GANTRY_TOKEN_LIFETIME_DAYS` has passed, with a message that
says when it expired and how to get a new one. A token issued before this rule existed expires
the same way, by its creation date: none lives forever. `POST /api/v1/auth/token/` answers the
user's token while it is valid and a fresh one once it expired; `POST /api/v1/auth/token/rotate/`,
sent with the token, answers a fresh token and revokes the one it came with at once.

The tokens of accounts without a usable password do not expire: those are node agents'
(`manage.py node_agent_token`, for agents outside Kubernetes), machine credentials that cannot
log in again by themselves and are rotated with `node_agent_token --rotate` (on Kubernetes an
agent uses its pod's own short-lived token instead).
"""

from __future__ import annotations

import datetime as dt
from typing import Any

from django.conf import settings
from django.db import transaction
from django.utils import timezone
from rest_framework.authentication import TokenAuthentication
from rest_framework.authtoken.models import Token
from rest_framework.exceptions import APIException


def token_expires(token: Token) -> dt.datetime:
    return token.created + dt.timedelta(days=settings.GANTRY_TOKEN_LIFETIME_DAYS)


def token_expired(token: Token, *, now: dt.datetime | None = None) -> bool:
    """Whether `token` is past its lifetime (one of an account that cannot log in never is)."""
    if (now or timezone.now()) < token_expires(token):
        return False
    return bool(token.user.has_usable_password())


def token_for_login(*, user: Any) -> Token:
    """The user's token after a successful login: the current one while valid, else a new one."""
    with transaction.atomic():
        token, created = Token.objects.select_for_update().get_or_create(user=user)
        if not created and token_expired(token):
            token.delete()
            token = Token.objects.create(user=user)
    return token


def token_rotate(*, token: Token) -> Token:
    """A fresh token for `token`'s user; `token` stops working at once."""
    with transaction.atomic():
        user = token.user
        Token.objects.filter(user=user).delete()
        return Token.objects.create(user=user)


class TokenExpired(APIException):
    """401 whatever authenticator comes first (DRF turns an AuthenticationFailed into a 403
    when the first one, the session's, names no WWW-Authenticate scheme)."""

    status_code = 401
    default_code = "token_expired"
    auth_header = "Token"


class ExpiringTokenAuthentication(TokenAuthentication):
    """DRF's `Authorization: Token <key>`, refused with 401 once the token expired."""

    def authenticate_credentials(self, key: str) -> tuple[Any, Token]:
        user, token = super().authenticate_credentials(key)
        if token_expired(token):
            expired = token_expires(token).strftime("%Y-%m-%d %H:%M UTC")
            raise TokenExpired(
                f"This API token expired on {expired} (tokens last "
                f"{settings.GANTRY_TOKEN_LIFETIME_DAYS:g} days). Get a new one: `gantry login`, "
                "or POST /api/v1/auth/token/ with your username and password."
            )
        return user, token
