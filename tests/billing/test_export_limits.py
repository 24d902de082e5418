"""Finance exports are bounded (issue 34, item 7): one queued or running per person, an
allowance a sliding day, a 429 saying when to try again, and a time limit that ends an export
failed instead of running on."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from celery.exceptions import SoftTimeLimitExceeded
from django.test import Client
from django.urls import reverse
from django.utils import timezone

from billing import tasks as billing_tasks
from billing.exports import formats as exports
from billing.exports import runs as export_runs
from billing.models import CostExport, ExportState
from common.errors import RateLimitedError
from config.celery import app as celery_app
from tests.billing.builders import T0
from tests.billing.test_statements import cluster
from tests.conftest import Org

pytestmark = pytest.mark.django_db

WINDOW = {"from": "2031-01-31T20:00:00Z", "to": "2031-02-01T00:00:00Z"}


@pytest.fixture(autouse=True)
def _export_dir(settings: Any, tmp_path: Path) -> None:
    settings.GANTRY_EXPORT_DIR = tmp_path / "exports"


def start(org: Org, who: str = "carol", now: Any = T0) -> CostExport:
    query = exports.query_from_json({**WINDOW, "by": "team"})
    return export_runs.cost_export_start(user=org.users[who], fmt="csv", query=query, now=now)


def test_a_second_export_waits_for_the_first_with_a_429(org: Org, client_for: Any) -> None:
    carol = client_for("carol")
    first = carol.post("/api/v1/cost-exports/", {**WINDOW, "by": "team"}, format="json")
    assert first.status_code == 201, first.content
    second = carol.post("/api/v1/cost-exports/", {**WINDOW, "by": "user"}, format="json")
    assert second.status_code == 429, second.content
    assert second["Retry-After"] == "30"
    assert f"export #{first.json()['id']} is still queued or running" in second.json()["detail"]
    assert CostExport.objects.count() == 1
    assert client_for("pat").post("/api/v1/cost-exports/", WINDOW, format="json").status_code == 201
    CostExport.objects.filter(pk=first.json()["id"]).update(state=ExportState.DONE)
    assert carol.post("/api/v1/cost-exports/", WINDOW, format="json").status_code == 201


def test_the_daily_allowance_says_when_the_next_export_may_start(org: Org, settings: Any) -> None:
    settings.GANTRY_EXPORT_RUNS_PER_DAY = 2
    for at in (T0, T0 + timedelta(hours=1)):
        CostExport.objects.filter(pk=start(org, now=at).pk).update(state=ExportState.FAILED)
    with pytest.raises(RateLimitedError) as refused:
        start(org, now=T0 + timedelta(hours=5))
    assert refused.value.retry_after_s == 19 * 3600 + 1  # T0 + 24 h, from T0 + 5 h
    assert "allowance of 2 exports a day" in str(refused.value)
    assert start(org, "pat", now=T0 + timedelta(hours=5)).owner == org.users["pat"]
    assert start(org, now=T0 + timedelta(hours=24, seconds=1)).state == ExportState.QUEUED


def test_an_export_past_its_time_limit_ends_failed_without_a_file(org: Org, settings: Any) -> None:
    """The limit is checked where progress is saved (as on the embedded worker, whose thread
    pool has no Celery time limits): a clock past it ends the export."""
    settings.GANTRY_EXPORT_TIME_LIMIT_S = 60
    cluster(org)
    export = start(org)
    ticks = iter([T0] + [T0 + timedelta(seconds=61)] * 10)
    assert export_runs.cost_export_run(export.pk, clock=lambda: next(ticks))
    export.refresh_from_db()
    assert (export.state, export.file) == (ExportState.FAILED, "")
    assert export.error == export_runs.time_limit_message()
    assert "time limit of 60 s" in export.error
    assert not any(Path(export_runs.export_dir()).iterdir())  # the partial file is gone


def test_celerys_soft_time_limit_ends_the_export_failed(
    org: Org, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The soft limit's exception, raised from inside the writing."""

    def limited(**kwargs: Any) -> int:
        raise SoftTimeLimitExceeded()

    monkeypatch.setattr(export_runs, "export_write", limited)
    export = start(org)
    assert export_runs.cost_export_run(export.pk, clock=lambda: T0)
    export.refresh_from_db()
    assert (export.state, export.error) == (ExportState.FAILED, export_runs.time_limit_message())
    assert start(org).state == ExportState.QUEUED  # it no longer holds its owner


def test_an_export_whose_worker_was_killed_frees_its_owner(org: Org) -> None:
    export = start(org)
    CostExport.objects.filter(pk=export.pk).update(state=ExportState.RUNNING)
    with pytest.raises(RateLimitedError):
        start(org, now=T0 + export_runs.STALE_AFTER - timedelta(seconds=1))
    again = start(org, now=T0 + export_runs.STALE_AFTER)
    export.refresh_from_db()
    assert export.state == ExportState.FAILED and "start it again" in export.error
    assert export.expires_at > T0 + export_runs.STALE_AFTER  # kept for its owner to read
    assert again.state == ExportState.QUEUED


def test_the_export_runs_on_the_reports_queue_with_time_limits(settings: Any) -> None:
    route = celery_app.amqp.router.route({}, billing_tasks.cost_export_run.name)
    assert route["queue"].name == "reports"
    task = billing_tasks.cost_export_run
    assert task.soft_time_limit == settings.GANTRY_EXPORT_TIME_LIMIT_S
    assert task.time_limit > task.soft_time_limit


def test_the_portal_says_why_an_export_was_refused(org: Org) -> None:
    start(org, now=timezone.now())
    client = Client()
    client.force_login(org.users["carol"])
    form = {"format": "csv", "from": "2031-01-31", "to": "2031-02-01", "by": "team"}
    answer = client.post(reverse("portal:cost-export-new"), form)
    assert answer.status_code == 429, answer.content[:300]
    assert "still queued or running" in answer.content.decode()
    assert CostExport.objects.count() == 1
