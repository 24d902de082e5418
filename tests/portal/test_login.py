"""Login and logout (docs/faults.md 29): failures are logged and, past a few, refused for a while;
login rotates the session key; logout is a POST that ends the session."""

from __future__ import annotations

import logging
from typing import Any

import pytest
from django.conf import settings
from django.core.cache import cache
from django.test import Client
from django.urls import reverse

from common import login_guard
from tests.conftest import Org

PASSWORD = "correct-horse-battery"  # tests.factories.UserFactory's password


def attempt(client: Client, username: str, password: str) -> Any:
    return client.post(reverse("portal:login"), {"username": username, "password": password})


def test_login_page_is_styled_and_has_a_csrf_token(db: Any) -> None:
    html = Client().get(reverse("portal:login")).content.decode()
    assert "Sign in to Gantry" in html and "csrfmiddlewaretoken" in html
    assert "/static/portal/portal.css" in html
    assert "https://" not in html.split("<body")[0]  # no CDN assets


def test_correct_password_logs_in(org: Org) -> None:
    response = attempt(Client(), "alice", PASSWORD)
    assert response.status_code == 302 and response.url == "/"


def test_failures_are_logged(org: Org, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="gantry.portal.login"):
        response = attempt(Client(), "alice", "wrong")
    assert (
        response.status_code == 200
        and "Please enter a correct username" in response.content.decode()
    )
    assert any("failed portal login for 'alice'" in r.getMessage() for r in caplog.records)


def test_too_many_failures_lock_the_account_from_that_address(
    org: Org, caplog: pytest.LogCaptureFixture
) -> None:
    client = Client()
    for _ in range(login_guard.PER_ACCOUNT):
        assert attempt(client, "alice", "wrong").status_code == 200
    with caplog.at_level(logging.WARNING, logger="gantry.portal.login"):
        refused = attempt(client, "alice", PASSWORD)  # even the right password
    assert refused.status_code == 429
    assert "Too many failed sign-ins" in refused.content.decode()
    assert "_auth_user_id" not in client.session
    assert any("refused" in r.getMessage() for r in caplog.records)
    # another address, or another account, is not locked out
    assert attempt(Client(REMOTE_ADDR="10.9.8.7"), "alice", PASSWORD).status_code == 302
    assert attempt(Client(), "tina", PASSWORD).status_code == 302


def test_spraying_many_accounts_from_one_address_is_refused(org: Org) -> None:
    client = Client(REMOTE_ADDR="10.1.1.1")
    for number in range(login_guard.PER_ADDRESS):
        attempt(client, f"guess{number}", "wrong")
    assert attempt(client, "alice", PASSWORD).status_code == 429


def test_the_lock_ends_after_the_window(org: Org) -> None:
    client = Client()
    for _ in range(login_guard.PER_ACCOUNT):
        attempt(client, "alice", "wrong")
    assert attempt(client, "alice", PASSWORD).status_code == 429
    # The counters live in the cache with a timeout; expiring them is what time would do.
    cache.clear()
    assert attempt(client, "alice", PASSWORD).status_code == 302


def test_success_clears_the_account_counter(org: Org) -> None:
    client = Client()
    for _ in range(login_guard.PER_ACCOUNT - 1):
        attempt(client, "alice", "wrong")
    assert attempt(client, "alice", PASSWORD).status_code == 302
    other = Client()
    for _ in range(login_guard.PER_ACCOUNT - 1):
        attempt(other, "alice", "wrong")
    assert attempt(other, "alice", PASSWORD).status_code == 302


def test_login_rotates_the_session_key(org: Org) -> None:
    client = Client()
    session = client.session
    session["visited"] = True
    session.save()
    before = client.cookies[settings.SESSION_COOKIE_NAME].value
    attempt(client, "alice", PASSWORD)
    after = client.cookies[settings.SESSION_COOKIE_NAME].value
    assert after != before


def test_logout_is_a_post_and_ends_the_session(org: Org) -> None:
    client = Client()
    attempt(client, "alice", PASSWORD)
    old_key = client.cookies[settings.SESSION_COOKIE_NAME].value
    assert client.get(reverse("portal:logout")).status_code == 405
    assert client.get(reverse("portal:home")).status_code == 200
    response = client.post(reverse("portal:logout"))
    assert response.status_code == 302 and response.url == settings.LOGOUT_REDIRECT_URL
    # the old session id is dead, even replayed
    replay = Client()
    replay.cookies[settings.SESSION_COOKIE_NAME] = old_key
    home = replay.get(reverse("portal:home"))
    assert home.status_code == 302 and home.url.startswith(settings.LOGIN_URL)


def test_pages_need_a_login(db: Any) -> None:
    for name in ("portal:home", "portal:jobs", "portal:approvals", "portal:audit"):
        response = Client().get(reverse(name))
        assert response.status_code == 302 and response.url.startswith(settings.LOGIN_URL)


def test_forwarded_addresses_count_only_behind_trusted_proxies(org: Org, settings: Any) -> None:
    spoofed = {"HTTP_X_FORWARDED_FOR": "203.0.113.9"}
    for _ in range(login_guard.PER_ACCOUNT):
        Client(**spoofed).post(reverse("portal:login"), {"username": "alice", "password": "x"})
    # without a trusted proxy the header is ignored: the spoofer's own address is locked
    assert (
        attempt(Client(HTTP_X_FORWARDED_FOR="198.51.100.1"), "alice", PASSWORD).status_code == 429
    )
    settings.GANTRY_TRUSTED_PROXIES = ["127.0.0.1"]  # the test client's own address
    cache.clear()
    for _ in range(login_guard.PER_ACCOUNT):
        Client(**spoofed).post(reverse("portal:login"), {"username": "alice", "password": "x"})
    assert attempt(Client(**spoofed), "alice", PASSWORD).status_code == 429
    assert (
        attempt(Client(HTTP_X_FORWARDED_FOR="198.51.100.1"), "alice", PASSWORD).status_code == 302
    )


def test_a_polled_partial_after_logout_redirects_the_whole_window(org: Org) -> None:
    response = Client().get(reverse("portal:job-rows"), headers={"HX-Request": "true"})
    assert response.headers["HX-Redirect"] == settings.LOGIN_URL
    assert b"<html" not in response.content
