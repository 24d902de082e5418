"""Password guessing on `POST /api/v1/auth/token/` (issue 17, points 3, 11, 12, 13).

The token endpoint runs behind the portal's guard (`common.login_guard`): failures counted per
account and address and per address, a refusal even for the right password, successes free,
the client address read from X-Forwarded-For only when the direct peer is a trusted proxy.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

import pytest
from django.core.cache import cache
from django.test import Client, RequestFactory
from django.urls import reverse
from rest_framework.authtoken.models import Token

from common import login_guard
from tests.conftest import Org

PASSWORD = "correct-horse-battery"  # tests.factories.UserFactory's password
URL = "/api/v1/auth/token/"


@pytest.fixture(autouse=True)
def _clear_cache() -> Iterator[None]:
    """The guard counts failures in the cache: every test starts from zero and leaves none."""
    cache.clear()
    yield
    cache.clear()


def token_login(client: Client, username: str, password: str, **headers: str) -> Any:
    return client.post(
        URL, {"username": username, "password": password}, "application/json", headers=headers
    )


def test_a_spoofed_forwarded_for_does_not_give_a_fresh_counter(org: Org) -> None:
    client = Client()
    for number in range(login_guard.PER_ACCOUNT):
        response = token_login(client, "alice", "wrong", x_forwarded_for=f"203.0.113.{number}")
        assert response.status_code == 400
    refused = token_login(client, "alice", PASSWORD, x_forwarded_for="198.51.100.77")
    assert refused.status_code == 429
    assert "Too many failed logins" in refused.json()["detail"]
    assert int(refused["Retry-After"]) == login_guard.WINDOW_S
    assert not Token.objects.filter(user=org.users["alice"]).exists()


def test_a_valid_token_does_not_lift_the_guard(org: Org) -> None:
    own = Token.objects.create(user=org.users["bob-bravo"])
    client = Client(headers={"Authorization": f"Token {own.key}"})
    for _ in range(login_guard.PER_ACCOUNT):
        assert token_login(client, "alice", "wrong").status_code == 400
    assert token_login(client, "alice", PASSWORD).status_code == 429


def test_successful_token_logins_are_not_counted(org: Org) -> None:
    client = Client()
    for _ in range(3 * login_guard.PER_ACCOUNT):  # a script that logs in often
        assert token_login(client, "alice", PASSWORD).status_code == 200


def test_spraying_many_accounts_through_the_api_is_refused(org: Org) -> None:
    client = Client(REMOTE_ADDR="10.1.1.1")
    for number in range(login_guard.PER_ADDRESS):
        token_login(client, f"guess{number}", "wrong")
    assert token_login(client, "alice", PASSWORD).status_code == 429
    assert token_login(Client(REMOTE_ADDR="10.1.1.2"), "alice", PASSWORD).status_code == 200


def test_the_portal_and_the_api_share_the_counters(org: Org) -> None:
    client = Client()
    for _ in range(login_guard.PER_ACCOUNT):
        client.post(reverse("portal:login"), {"username": "alice", "password": "wrong"})
    assert token_login(client, "alice", PASSWORD).status_code == 429


def test_failed_api_logins_are_logged_with_username_and_address(
    org: Org, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, logger="gantry.api.login"):
        token_login(Client(REMOTE_ADDR="192.0.2.44"), "alice", "wrong")
    messages = [r.getMessage() for r in caplog.records if r.name == "gantry.api.login"]
    assert messages == ["failed API login for 'alice' from 192.0.2.44"]


def test_a_body_that_is_not_an_object_is_400(org: Org) -> None:
    response = Client().post(URL, "[1, 2]", "application/json")
    assert response.status_code == 400
    assert "errors" in response.json()


def test_clients_behind_a_trusted_proxy_have_their_own_counters(org: Org, settings: Any) -> None:
    settings.GANTRY_TRUSTED_PROXIES = ["10.0.0.0/8"]
    ingress = {"REMOTE_ADDR": "10.2.0.5"}
    for _ in range(login_guard.PER_ACCOUNT):
        token_login(Client(**ingress), "alice", "wrong", x_forwarded_for="203.0.113.9")
    assert (
        token_login(Client(**ingress), "alice", PASSWORD, x_forwarded_for="203.0.113.9").status_code
        == 429
    )
    # another client behind the same ingress is not locked out with the first one
    assert (
        token_login(
            Client(**ingress), "alice", PASSWORD, x_forwarded_for="198.51.100.1"
        ).status_code
        == 200
    )


@pytest.mark.parametrize(
    ("peer", "forwarded", "trusted", "expected"),
    [
        ("192.0.2.1", "", [], "192.0.2.1"),
        ("192.0.2.1", "203.0.113.9", [], "192.0.2.1"),
        ("192.0.2.1", "203.0.113.9", ["10.0.0.0/8"], "192.0.2.1"),
        ("10.0.0.2", "203.0.113.9", ["10.0.0.0/8"], "203.0.113.9"),
        ("10.0.0.2", "6.6.6.6, 203.0.113.9", ["10.0.0.0/8"], "203.0.113.9"),
        ("10.0.0.2", "6.6.6.6, 203.0.113.9, 10.0.0.7", ["10.0.0.0/8"], "203.0.113.9"),
        ("10.0.0.2", "not-an-ip, 10.0.0.7", ["10.0.0.0/8"], "10.0.0.7"),
        ("10.0.0.2", "", ["10.0.0.0/8"], "10.0.0.2"),
        ("2001:db8::5", "2001:db8:1::9", ["2001:db8::/64"], "2001:db8:1::9"),
    ],
    ids=[
        "direct",
        "direct-spoofing",
        "untrusted-peer-spoofing",
        "behind-ingress",
        "client-claim-left-of-ingress-ignored",
        "two-trusted-hops",
        "garbage-left-of-trusted-hops",
        "trusted-peer-without-header",
        "ipv6",
    ],
)
def test_client_address_reads_forwarded_for_only_from_trusted_proxies(
    settings: Any, peer: str, forwarded: str, trusted: list[str], expected: str
) -> None:
    settings.GANTRY_TRUSTED_PROXIES = trusted
    request = RequestFactory().get("/", REMOTE_ADDR=peer, HTTP_X_FORWARDED_FOR=forwarded)
    assert login_guard.client_address(request) == expected
