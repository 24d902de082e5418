"""API tokens expire and rotate (issue 34, item 8; common/api/tokens.py)."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest
from django.test import Client
from django.utils import timezone
from rest_framework.authtoken.models import Token

from tests.conftest import Org

PASSWORD = "correct-horse-battery"  # tests.factories.UserFactory's password


def issued(user: Any, *, days_ago: float) -> Token:
    token = Token.objects.create(user=user)
    Token.objects.filter(pk=token.pk).update(created=timezone.now() - dt.timedelta(days=days_ago))
    return token


def revoked(key: str) -> bool:
    """An unknown token: refused as any wrong token is (403, DRF's "Invalid token.")."""
    response = me(key)
    return response.status_code == 403 and response.json()["detail"] == "Invalid token."


def me(key: str) -> Any:
    return Client(headers={"Authorization": f"Token {key}"}).get("/api/v1/me/")


@pytest.mark.parametrize(
    ("days_ago", "status"),
    [(29.9, 200), (30.1, 401), (400, 401)],
    ids=["within-lifetime", "just-expired", "issued-before-expiry-existed"],
)
def test_a_token_is_refused_after_its_lifetime(org: Org, days_ago: float, status: int) -> None:
    token = issued(org.users["alice"], days_ago=days_ago)  # GANTRY_TOKEN_LIFETIME_DAYS: 30
    response = me(token.key)
    assert response.status_code == status
    if status == 401:
        detail = response.json()["detail"]
        assert "This API token expired on" in detail and "gantry login" in detail


def test_the_lifetime_is_a_setting(org: Org, settings: Any) -> None:
    settings.GANTRY_TOKEN_LIFETIME_DAYS = 7
    assert me(issued(org.users["alice"], days_ago=8).key).status_code == 401


def test_logging_in_again_replaces_an_expired_token(org: Org) -> None:
    old = issued(org.users["alice"], days_ago=31)
    response = Client().post(
        "/api/v1/auth/token/", {"username": "alice", "password": PASSWORD}, "application/json"
    )
    assert response.status_code == 200
    fresh = response.json()
    assert fresh["token"] != old.key and fresh["expires"]
    assert me(fresh["token"]).status_code == 200
    assert revoked(old.key)


def test_logging_in_keeps_a_valid_token(org: Org) -> None:
    current = issued(org.users["alice"], days_ago=1)
    response = Client().post(
        "/api/v1/auth/token/", {"username": "alice", "password": PASSWORD}, "application/json"
    )
    assert response.json()["token"] == current.key


def test_rotation_answers_a_fresh_token_and_revokes_the_old_one(org: Org) -> None:
    old = issued(org.users["alice"], days_ago=20)
    response = Client(headers={"Authorization": f"Token {old.key}"}).post(
        "/api/v1/auth/token/rotate/", {}, "application/json"
    )
    assert response.status_code == 200
    fresh = response.json()["token"]
    assert fresh != old.key
    assert revoked(old.key)
    assert me(fresh).status_code == 200
    expires = dt.datetime.fromisoformat(response.json()["expires"])
    assert expires - timezone.now() > dt.timedelta(days=29)  # a full lifetime from now


def test_rotation_needs_a_valid_token(org: Org) -> None:
    assert Client().post("/api/v1/auth/token/rotate/").status_code == 403  # no credentials
    expired = issued(org.users["alice"], days_ago=31)
    headers = {"Authorization": f"Token {expired.key}"}
    assert Client(headers=headers).post("/api/v1/auth/token/rotate/").status_code == 401


def test_a_node_agents_token_does_not_expire(org: Org) -> None:
    """An agent cannot log in again by itself: its token is rotated by `node_agent_token`."""
    agent = org.users["alice"].__class__.objects.create(username="node-agent-gpu-1")
    agent.set_unusable_password()
    agent.save()
    response = me(issued(agent, days_ago=400).key)
    assert response.status_code != 401  # authenticated; what it may do is PeopleOnly's
