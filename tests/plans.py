"""The plan PostgreSQL would choose for a query, asked with sequential scans priced out: test
tables are tiny, so the question is which index would serve the reader, not whether a scan
costs less on a few rows."""

from __future__ import annotations

from typing import Any

from django.db import connection


def index_plan(queryset: Any) -> str:
    sql, params = queryset.query.sql_with_params()
    with connection.cursor() as cursor:
        cursor.execute("SET LOCAL enable_seqscan = off")
        cursor.execute(f"EXPLAIN {sql}", params)
        return "\n".join(row[0] for row in cursor.fetchall())
