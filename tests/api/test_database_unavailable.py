"""The API while PostgreSQL restarts: 503 with Retry-After, not 500 (found by bench/chaos/,
issue 21: a submission during `pg_ctl restart` got a 500 "the database system is starting
up"). A query that fails on a reachable server stays the error it is."""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from typing import Any

import psycopg
import pytest
from django.db import OperationalError

from common.api.errors import database_unavailable
from scheduler.api import views


def raising(cause: Exception) -> Callable[..., Any]:
    def fail(*args: Any, **kwargs: Any) -> Any:
        raise OperationalError(str(cause)) from cause

    return fail


@pytest.mark.django_db
def test_api_answers_503_with_retry_after_while_the_database_restarts(
    client_for: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    starting = psycopg.OperationalError(
        'connection failed: connection to server at "127.0.0.1", port 5432 failed: '
        "FATAL:  the database system is starting up"
    )
    monkeypatch.setattr(views.selectors, "job_list_visible", raising(starting))
    response = client_for("alice").get("/api/v1/jobs/")
    assert response.status_code == 503
    assert response["Retry-After"] == "5"
    assert "retry" in response.json()["detail"]


@pytest.mark.django_db
def test_a_query_error_on_a_reachable_database_is_not_called_unavailable(
    client_for: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    cancelled = psycopg.errors.QueryCanceled("canceling statement due to statement timeout")
    monkeypatch.setattr(views.selectors, "job_list_visible", raising(cancelled))
    with pytest.raises(OperationalError):
        client_for("alice").get("/api/v1/jobs/")


@pytest.mark.parametrize(
    ("cause", "unavailable"),
    [
        (psycopg.OperationalError("connection failed: Connection refused"), True),
        (psycopg.errors.AdminShutdown("terminating connection due to administrator command"), True),
        (psycopg.errors.CannotConnectNow("the database system is starting up"), True),
        (psycopg.errors.LockNotAvailable("canceling statement due to lock timeout"), False),
        (sqlite3.OperationalError("no such table: scheduler_job"), False),
    ],
    ids=["refused", "admin-shutdown", "starting-up", "lock-timeout", "sqlite-query"],
)
def test_which_database_errors_mean_unavailable(cause: Exception, unavailable: bool) -> None:
    try:
        raising(cause)()
    except OperationalError as error:
        assert database_unavailable(error) is unavailable
