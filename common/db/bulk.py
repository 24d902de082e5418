"""Rows into a table by COPY, the way the bulk writes of the daemon and of utilization
ingest reach PostgreSQL (text format; billing's metering writes binary with its own types).

`copy_rows` sends each row, a sequence in the order of `columns`, inside the caller's
transaction, with Django's error translation (a refused row is Django's IntegrityError).
COPY fires a table's triggers as INSERT does. PostgreSQL only: callers keep `bulk_create`
for other databases.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from django.db import connection


def copy_rows(table: str, columns: Sequence[str], rows: Iterable[Sequence[Any]]) -> None:
    sql = f"COPY {table} ({', '.join(columns)}) FROM STDIN"
    with (
        connection.cursor() as cursor,
        connection.wrap_database_errors,
        cursor.cursor.copy(sql) as copy,
    ):
        for row in rows:
            copy.write_row(row)
