"""Password guessing on `POST /api/v1/auth/token/` (issue 17, points 3, 11, 12, 13; issue 34,
item 2: a backoff per account that no client address changes, and a rate limit).

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


@pytest.fixture
def _unthrottled(settings: Any) -> None:
    """The login guard alone: the token endpoint's rate limit (its own test) out of the way."""
    settings.REST_FRAMEWORK = {
        **settings.REST_FRAMEWORK,
        "DEFAULT_THROTTLE_RATES": {
            **settings.REST_FRAMEWORK["DEFAULT_THROTTLE_RATES"],
            "login": "10000/min",
        },
    }


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


@pytest.mark.usefixtures("_unthrottled")
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


# --- issue 34, item 2: the account's backoff, whatever the client address -------------------


@pytest.fixture
def now(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    """The guard's clock, moved by the test: `now[0] += 60`."""
    moment = [1_800_000_000.0]
    monkeypatch.setattr(login_guard, "clock", lambda: moment[0])
    return moment


def rotating_guesses(username: str, count: int) -> list[int]:
    """The issue's attack: from a trusted proxy (the pod network once trusted), each wrong
    password with a fresh X-Forwarded-For, so no address counter ever fills."""
    ingress = Client(REMOTE_ADDR="10.2.0.5")
    return [
        token_login(
            ingress, username, f"guess-{n}", x_forwarded_for=f"198.18.{n // 250}.{n % 250 + 1}"
        ).status_code
        for n in range(count)
    ]


@pytest.mark.usefixtures("_unthrottled")
def test_rotating_forwarded_for_does_not_escape_the_account_backoff(
    org: Org, settings: Any, now: list[float]
) -> None:
    settings.GANTRY_TRUSTED_PROXIES = ["10.0.0.0/8"]
    codes = rotating_guesses("alice", 40)
    # ACCOUNT_FREE (10) failures are answered 400; then the account waits 2 s (the clock
    # stands still), so the 30 other guesses are refused unchecked.
    assert codes == [400] * login_guard.ACCOUNT_FREE + [429] * (40 - login_guard.ACCOUNT_FREE)
    right = token_login(
        Client(REMOTE_ADDR="10.2.0.5"), "alice", PASSWORD, x_forwarded_for="198.51.100.20"
    )
    assert right.status_code == 429
    assert "Too many failed logins for this account." in right.json()["detail"]
    assert int(right["Retry-After"]) == 2  # BACKOFF_BASE_S after the 10th failure
    assert not Token.objects.filter(user=org.users["alice"]).exists()
    # another account is not slowed down
    assert token_login(Client(), "tina", PASSWORD).status_code == 200


@pytest.mark.usefixtures("_unthrottled")
def test_the_account_backoff_doubles_up_to_its_cap_then_lets_the_owner_in(
    org: Org, now: list[float]
) -> None:
    client = Client()
    for n in range(login_guard.ACCOUNT_FREE + 12):
        refused = token_login(client, "alice", "wrong", x_forwarded_for="x")  # not trusted
        if refused.status_code == 429:
            now[0] += int(refused["Retry-After"])  # an attacker waiting out each delay
            refused = token_login(Client(REMOTE_ADDR=f"192.0.2.{n}"), "alice", "wrong")
        assert refused.status_code == 400, n
    # Delays after the 10th failure: 2, 4, ..., 256, then the cap: 300 s, never longer.
    wait = token_login(Client(REMOTE_ADDR="198.51.100.9"), "alice", PASSWORD)
    assert wait.status_code == 429 and int(wait["Retry-After"]) == login_guard.BACKOFF_CAP_S
    now[0] += login_guard.BACKOFF_CAP_S
    owner = token_login(Client(REMOTE_ADDR="198.51.100.9"), "alice", PASSWORD)
    assert owner.status_code == 200 and "token" in owner.json()
    # a success clears the backoff: the next typo is a plain 400
    assert token_login(Client(REMOTE_ADDR="198.51.100.9"), "alice", "typo").status_code == 400


@pytest.mark.usefixtures("_unthrottled")
def test_one_attempt_at_a_time_takes_the_slot_that_opens(
    org: Org, settings: Any, now: list[float]
) -> None:
    settings.GANTRY_TRUSTED_PROXIES = ["10.0.0.0/8"]
    assert rotating_guesses("alice", login_guard.ACCOUNT_FREE) == [400] * login_guard.ACCOUNT_FREE
    now[0] += login_guard.BACKOFF_BASE_S
    # The slot is taken by the first attempt through the guard (its outcome not yet known):
    # a concurrent one is refused, so parallel requests do not multiply the guesses.
    assert login_guard.refusal("alice", "192.0.2.1") is None
    concurrent = login_guard.refusal("alice", "192.0.2.2")
    assert concurrent is not None and concurrent.account_wide


def test_the_token_endpoint_is_rate_limited_per_address(org: Org) -> None:
    client = Client(REMOTE_ADDR="192.0.2.60")
    codes = [token_login(client, "alice", PASSWORD).status_code for _ in range(21)]
    assert codes == [200] * 20 + [429]  # GANTRY_THROTTLE_LOGIN: 20/min
    assert token_login(Client(REMOTE_ADDR="192.0.2.61"), "alice", PASSWORD).status_code == 200
