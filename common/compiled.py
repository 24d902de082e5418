"""Reads the same code runs over and over (the scheduler daemon's, every cycle), built and
compiled to SQL through the ORM once per process, then run as SQL: building and compiling a
queryset costs more than running a small query."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from django.db import connection
from django.db.models import QuerySet

_compiled: dict[tuple[Any, ...], tuple[str, tuple[Any, ...]]] = {}


def fetch_compiled(key: tuple[Any, ...], query: Callable[[], Any]) -> list[tuple[Any, ...]]:
    """The rows of the queryset `query()` builds, which must depend on `key` alone: built
    and compiled to SQL once per key and process, then executed as SQL. The daemon runs the
    same few reads every cycle, and building and compiling them through the ORM cost more
    than running them."""
    compiled = _compiled.get(key)
    if compiled is None:
        compiled = _compiled[key] = query().query.sql_with_params()
    with connection.cursor() as cursor:
        cursor.execute(*compiled)
        return cursor.fetchall()


# A list no caller passes: found among the compiled parameters, it marks the ids' slot.
_IDS_MARK = [-918_273_645]
_by_ids: dict[tuple[Any, ...], tuple[str, list[Any], int, Any, list[str]]] = {}


def fetch_by_ids(
    key: tuple[Any, ...], query: Callable[[list[int]], QuerySet[Any, Any]], ids: Sequence[int]
) -> list[dict[str, Any]]:
    """`query(ids).values(...)`'s rows, for a `query` that filters with `__any=ids` and
    otherwise depends on `key` alone: built and compiled once per key and process (as
    `fetch_compiled`), then run with the ids of each call. The ORM's converters apply (JSON,
    times), so the rows are those `values()` gives. The ids are one array on PostgreSQL;
    elsewhere (a parameter per id) the queryset runs as it is."""
    if not ids:
        return []
    if connection.vendor != "postgresql":
        return list(query(list(ids)))
    entry = _by_ids.get(key)
    if entry is None:
        queryset = query(list(_IDS_MARK))
        compiler = queryset.query.get_compiler(queryset.db)
        sql, params = compiler.as_sql()
        slot = next(i for i, p in enumerate(params) if p == _IDS_MARK)
        q = queryset.query
        names = [*q.extra_select, *q.values_select, *q.annotation_select]
        entry = _by_ids[key] = (sql, list(params), slot, compiler, names)
    sql, params, slot, compiler, names = entry
    params = [*params[:slot], list(ids), *params[slot + 1 :]]
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        rows = cursor.fetchall()
    return [dict(zip(names, row, strict=True)) for row in compiler.results_iter(results=[rows])]
