"""Errors Django writes itself (issue 34, item 20): under /api/ they answer the API's JSON error
shape whatever DEBUG says, and DEBUG's technical pages (the 404 listing every route, the 500
with its traceback and settings) go to loopback clients only (common.middleware)."""

from __future__ import annotations

from typing import Any

import pytest
from django.test import Client

pytestmark = pytest.mark.urls("tests.api.error_urls")

REMOTE = {"REMOTE_ADDR": "192.0.2.10"}
TECHNICAL = ("DEBUG = True", "URLconf", "Traceback", "secret-ish")


def client(**extra: Any) -> Client:
    return Client(raise_request_exception=False, **extra)


@pytest.mark.parametrize("debug", [True, False], ids=["debug", "no-debug"])
@pytest.mark.parametrize(
    ("method", "path", "status", "detail"),
    [
        ("get", "/api/v1/no-such-route/", 404, "Not found."),
        ("get", "/api/v2/", 404, "Not found."),
        ("get", "/api/v1/test-boom/", 500, "A server error occurred."),
        ("post", "/api/v1/test-get-only/", 405, "Method not allowed."),
    ],
    ids=["unrouted", "unknown-version", "exception", "method"],
)
def test_api_errors_are_json_whatever_debug_says(
    db: Any, settings: Any, debug: bool, method: str, path: str, status: int, detail: str
) -> None:
    settings.DEBUG = debug
    response = getattr(client(), method)(path)  # from loopback: the most DEBUG would show
    assert response.status_code == status
    assert response["Content-Type"] == "application/json"
    assert response.json() == {"detail": detail}
    if status == 405:
        assert response["Allow"] == "GET"


@pytest.mark.parametrize(
    ("path", "status"), [("/no-such-page/", 404), ("/test-boom/", 500)], ids=["404", "500"]
)
def test_debug_pages_are_for_loopback_clients_only(
    db: Any, settings: Any, path: str, status: int
) -> None:
    settings.DEBUG = True  # as `make run` runs
    remote = client(**REMOTE).get(path)
    assert remote.status_code == status
    assert not any(marker in remote.content.decode() for marker in TECHNICAL)
    local = client().get(path)  # the developer at the machine keeps the technical page
    assert local.status_code == status and "DEBUG = True" in local.content.decode()


def test_a_disallowed_host_shows_no_settings_to_remote_clients(db: Any, settings: Any) -> None:
    settings.DEBUG = True
    remote = client(**REMOTE).get("/", HTTP_HOST="evil.example")
    assert remote.status_code == 400
    assert "DEBUG = True" not in remote.content.decode()


@pytest.mark.parametrize("debug", [True, False], ids=["debug", "no-debug"])
def test_a_path_without_its_trailing_slash_is_a_json_404_that_names_the_route(
    db: Any, settings: Any, debug: bool
) -> None:
    # A POST without its slash reached the catch-all 404 with no hint of the route it meant.
    settings.DEBUG = debug
    response = client().post("/api/v1/test-get-only", {"a": 1})
    assert response.status_code == 404
    assert response["Content-Type"] == "application/json"
    assert "/api/v1/test-get-only/" in response.json()["detail"]
