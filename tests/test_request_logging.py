"""Ordinary refusals are not logged as faults (issue 35, "Smaller things"): a 403 is one
warning line without a traceback; a 5xx still has its traceback."""

from __future__ import annotations

import logging
from typing import Any

import pytest
from django.test import Client

from portal.views import profile
from tests.conftest import Org

pytestmark = pytest.mark.django_db


def request_records(caplog: pytest.LogCaptureFixture, path: str) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name == "django.request" and path in r.getMessage()]


@pytest.mark.parametrize(
    ("path", "method"),
    [
        ("/costs/", "get"),  # a portal view's PermissionDenied
        ("/scheduler/profile/", "get"),
        ("/api/v1/tenants/{alpha}/webhook/test/", "post"),  # DRF's: a member is no admin
    ],
    ids=["portal-costs", "portal-profile", "api-webhook-test"],
)
def test_a_403_is_one_line_without_a_traceback(
    org: Org, caplog: pytest.LogCaptureFixture, path: str, method: str
) -> None:
    path = path.format(alpha=org.alpha.pk)
    client = Client()
    client.force_login(org.users["alice"])  # a member: no costs, no profile, no node actions
    caplog.set_level(logging.INFO, logger="django.request")
    json = {"data": {}, "content_type": "application/json"} if method == "post" else {}
    assert getattr(client, method)(path, **json).status_code == 403
    records = request_records(caplog, path)
    assert [(r.levelname, r.exc_info, r.exc_text) for r in records] == [("WARNING", None, None)]
    assert "Forbidden" in records[0].getMessage()
    assert "Traceback" not in caplog.text


def test_a_500_keeps_its_traceback(
    org: Org, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken() -> Any:
        raise RuntimeError("the profile record is unreadable")

    monkeypatch.setattr(profile, "profile_record_get", broken)
    client = Client(raise_request_exception=False)
    client.force_login(org.users["pat"])  # a platform admin: past the access check
    caplog.set_level(logging.INFO, logger="django.request")
    assert client.get("/scheduler/profile/").status_code == 500
    (record,) = request_records(caplog, "/scheduler/profile/")
    assert record.levelname == "ERROR" and record.exc_info is not None
    assert isinstance(record.exc_info[1], RuntimeError)


def test_the_console_writes_to_stderr_as_it_is_at_each_record(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Logging configured while sys.stderr was a stream since closed (each django.setup()
    configures it again: a benchmark run inside a test did, under a test's captured output)
    still writes each record to the current sys.stderr, not a "--- Logging error ---"
    traceback there (tests/k8s/test_logs_cli.py saw one, intermittently)."""
    import io
    import logging.config

    from django.conf import settings

    then = io.StringIO()
    monkeypatch.setattr("sys.stderr", then)
    logger = logging.getLogger("gantry.test.console")
    logging.config.dictConfig(settings.LOGGING)  # as django.setup() does
    then.close()
    now = io.StringIO()
    monkeypatch.setattr("sys.stderr", now)
    try:
        logger.warning("after the stream it was set up with closed")
    finally:
        logging.config.dictConfig(settings.LOGGING)
    written = now.getvalue()
    assert "after the stream it was set up with closed" in written
    assert "Logging error" not in written
