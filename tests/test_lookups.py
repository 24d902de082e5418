"""`field__any=values` (common.db.lookups): one array parameter on PostgreSQL, IN elsewhere."""

from __future__ import annotations

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from scheduler.models import Job, JobEvent
from tests.factories import JobFactory

pytestmark = pytest.mark.django_db


def test_any_selects_the_listed_rows_by_key_and_by_foreign_key() -> None:
    a, b, c = JobFactory(), JobFactory(), JobFactory()
    JobEvent.objects.create(job=a, kind="state", from_state="", to_state="queued")
    JobEvent.objects.create(job=c, kind="state", from_state="", to_state="queued")
    assert set(Job.objects.filter(id__any=[a.pk, c.pk]).values_list("id", flat=True)) == {
        a.pk,
        c.pk,
    }
    assert set(Job.objects.filter(id__any=(b.pk,)).values_list("id", flat=True)) == {b.pk}
    assert set(
        JobEvent.objects.filter(job_id__any=[a.pk, b.pk]).values_list("job_id", flat=True)
    ) == {a.pk}
    assert Job.objects.filter(id__any=[a.pk]).update(reason="picked") == 1
    assert Job.objects.get(pk=a.pk).reason == "picked"


def test_an_empty_list_matches_nothing_and_sends_no_query() -> None:
    JobFactory()
    with CaptureQueriesContext(connection) as sent:
        assert list(Job.objects.filter(id__any=[])) == []
        assert Job.objects.filter(id__any=[]).update(reason="x") == 0
    assert sent.captured_queries == []


def test_the_list_is_one_parameter_on_postgresql_and_in_elsewhere(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    ids = list(range(1, 2001))
    sql, params = Job.objects.filter(id__any=ids).values("id").query.sql_with_params()
    if connection.vendor == "postgresql":
        assert '"scheduler_job"."id" = ANY(%s)' in sql
        assert list(params) == [ids]
    monkeypatch.setattr(connection, "vendor", "sqlite")
    sql, params = Job.objects.filter(id__any=ids).values("id").query.sql_with_params()
    assert '"scheduler_job"."id" IN (' in sql
    assert list(params) == ids
