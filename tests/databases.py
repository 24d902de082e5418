"""Databases beside the test database: the default connection pointed at another for a
block (a restored backup, an installation being upgraded), and PostgreSQL's created and
dropped."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import psycopg
from django.db import connection
from psycopg import sql


def pg_params() -> dict[str, Any]:
    """psycopg's connection arguments of the default connection, less the database."""
    s = connection.settings_dict
    keys = [("host", "HOST"), ("port", "PORT"), ("user", "USER"), ("password", "PASSWORD")]
    return {k: s.get(v) or None for k, v in keys}


def pg_url(name: str) -> str:
    """A DATABASE_URL for the database `name` on the test database's server."""
    p = pg_params()
    auth = p["user"] or "postgres"
    if p["password"]:
        auth += f":{p['password']}"
    return f"postgres://{auth}@{p['host'] or '127.0.0.1'}:{p['port'] or 5432}/{name}"


def drop_database(name: str) -> None:
    with psycopg.connect(dbname="postgres", autocommit=True, **pg_params()) as admin:
        admin.execute(
            sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
        )


def create_database(name: str) -> None:
    drop_database(name)
    with psycopg.connect(dbname="postgres", autocommit=True, **pg_params()) as admin:
        admin.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))


@contextmanager
def database_named(name: str, *, drop: bool = True) -> Iterator[None]:
    """The default connection pointed at the database `name` for the block; on PostgreSQL
    the database is dropped afterwards (unless `drop` is False)."""
    settings = connection.settings_dict
    old = settings["NAME"]
    connection.close()
    settings["NAME"] = name
    try:
        yield
    finally:
        connection.close()
        settings["NAME"] = old
        if drop and connection.vendor == "postgresql":
            drop_database(name)
