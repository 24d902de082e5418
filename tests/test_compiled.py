"""Reads compiled once per process (common.compiled): the same rows as the queryset, with
the ORM's converters, for every list of ids; one statement, nothing built again."""

from __future__ import annotations

import itertools
from typing import Any

import pytest
from django.db import connection
from django.db.models.expressions import RawSQL
from django.test.utils import CaptureQueriesContext

from common import compiled
from common.compiled import fetch_by_ids, fetch_compiled
from scheduler.models import Job
from tests.factories import JobFactory

pytestmark = pytest.mark.django_db
FIELDS = ("id", "name", "state", "queued_at", "tenant__slug", "spec__command", "spec__env")
_keys = itertools.count()


def _key() -> tuple[Any, ...]:
    """A key of its own for each test: what one compiled stays for the process."""
    return ("test", next(_keys))


def _rows(ids: list[int]) -> Any:
    return Job.objects.filter(id__any=ids).values(*FIELDS)


def test_rows_are_those_of_the_queryset_for_each_call_s_ids() -> None:
    """Times aware, JSON decoded, joined columns named as `values()` names them; each call
    with its own ids, though the queryset was built only once."""
    jobs = [JobFactory(spec={"command": ["run", str(i)], "env": {"I": str(i)}}) for i in range(4)]
    key = _key()
    for some in ([jobs[0].pk, jobs[2].pk], [jobs[1].pk], [j.pk for j in jobs]):
        got = sorted(fetch_by_ids(key, _rows, some), key=lambda r: r["id"])
        assert got == sorted(_rows(some), key=lambda r: r["id"])
        assert [r["id"] for r in got] == sorted(some)
    row = fetch_by_ids(key, _rows, [jobs[3].pk])[0]
    assert row["spec__command"] == ["run", "3"] and row["spec__env"] == {"I": "3"}
    assert row["queued_at"] is None or row["queued_at"].tzinfo is not None


def test_the_queryset_is_built_once_per_key() -> None:
    a, b = JobFactory(), JobFactory()
    built: list[list[int]] = []

    def query(ids: list[int]) -> Any:
        built.append(ids)
        return _rows(ids)

    key = _key()
    fetch_by_ids(key, query, [a.pk])
    with CaptureQueriesContext(connection) as sent:
        assert [r["id"] for r in fetch_by_ids(key, query, [b.pk])] == [b.pk]
    assert len(sent.captured_queries) == 1
    # built once for the key on PostgreSQL; elsewhere the queryset runs as it is
    assert len(built) == (1 if connection.vendor == "postgresql" else 2)


def test_no_ids_send_no_query() -> None:
    with CaptureQueriesContext(connection) as sent:
        assert fetch_by_ids(_key(), _rows, []) == []
    assert sent.captured_queries == []


@pytest.mark.postgresql("the ids are one array parameter")
def test_the_ids_go_as_one_parameter_wherever_the_filter_puts_them() -> None:
    """The ids' slot is found among the compiled parameters, after the others."""
    job = JobFactory(name="kept")
    JobFactory(name="kept")

    def query(ids: list[int]) -> Any:
        return (
            Job.objects.annotate(marked=RawSQL("%s", ("m",)))
            .filter(name="kept", id__any=ids)
            .values("id", "marked")
        )

    assert fetch_by_ids(_key(), query, [job.pk]) == [{"id": job.pk, "marked": "m"}]
    assert any(k[0] == "test" for k in compiled._by_ids)


def test_fetch_compiled_runs_the_sql_built_once() -> None:
    job = JobFactory()
    key = _key()
    first = fetch_compiled(key, lambda: Job.objects.filter(pk=job.pk).values_list("id", "state"))
    again = fetch_compiled(key, lambda: Job.objects.none())  # not built again: the same SQL
    assert first == again == [(job.pk, job.state)]
