"""Back up an installation's database to one file and restore it into a fresh database
(`manage.py backup FILE`, `manage.py restore FILE`; docs/upgrading.md "Backups").

- PostgreSQL: `pg_dump -Fc` (one consistent snapshot, taken while the web, the worker and the
  daemon keep running) and `pg_restore` into an empty database, in one transaction, so a
  restore that fails leaves the database empty rather than half filled.
- SQLite (the embedded default): the sqlite3 online backup API, which copies a consistent
  image page by page while other processes keep writing (copying the file itself could catch
  a write half done, and misses what still sits in the WAL).

The file is the database alone. The cluster is not in it: its pods keep running (the
simulated cluster's stand in `GANTRY_SIM_STATE_FILE`), and a daemon started on the restored
database adopts them (scheduler/daemon/reconcile.py). Restore refuses a database that holds
tables, and a file of the other engine's kind, before changing anything.
"""

from __future__ import annotations

import os
import shutil
import sqlite3
import subprocess
from pathlib import Path
from typing import Any

import psycopg
from django.db import connections
from psycopg import sql

PG_MAGIC = b"PGDMP"  # the first bytes of pg_dump's custom format
SQLITE_MAGIC = b"SQLite format 3\x00"


class BackupError(Exception):
    """What went wrong, in words an operator can act on."""


def engine(alias: str = "default") -> str:
    """'postgresql' or 'sqlite'."""
    vendor = connections[alias].vendor
    if vendor not in ("postgresql", "sqlite"):
        raise BackupError(f"no backup for the {vendor} engine")
    return vendor


def backup(path: Path, alias: str = "default") -> None:
    """Write a consistent copy of the database to `path` (replaced whole: written aside,
    then renamed, so an interrupted backup never leaves a truncated file under the name)."""
    path = Path(path)
    part = path.with_name(path.name + ".part")
    if engine(alias) == "postgresql":
        _run(["pg_dump", "--format=custom", f"--file={part}"], alias)
    else:
        _sqlite_copy(_sqlite_connection(alias), part)
    part.replace(path)


def restore(path: Path, alias: str = "default") -> None:
    """Load the backup at `path` into the database `alias` names, which must be empty (on
    PostgreSQL it is created when it does not exist). Every process must be stopped."""
    path = Path(path)
    kind = _kind_of(path)
    if kind != engine(alias):
        raise BackupError(f"{path} is a {kind} backup; this installation runs on {engine(alias)}")
    connections[alias].close()
    if kind == "postgresql":
        name = _pg_prepare(alias)
        _run(["pg_restore", "--exit-on-error", "--single-transaction", "--no-owner",
              f"--dbname={name}", str(path)], alias)  # fmt: skip
    else:
        _sqlite_restore(path, Path(connections[alias].settings_dict["NAME"]))


def _kind_of(path: Path) -> str:
    try:
        with path.open("rb") as f:
            head = f.read(len(SQLITE_MAGIC))
    except OSError as exc:
        raise BackupError(f"cannot read {path}: {exc.strerror}") from exc
    if head.startswith(PG_MAGIC):
        return "postgresql"
    if head == SQLITE_MAGIC:
        return "sqlite"
    raise BackupError(f"{path} is not a Gantry backup (neither pg_dump's custom format nor SQLite)")


# --- PostgreSQL ----------------------------------------------------------------------------


def _pg_env(alias: str) -> dict[str, str]:
    """libpq's variables for the connection `alias` (a password never on a command line)."""
    settings = connections[alias].settings_dict
    pairs = {
        "PGHOST": settings.get("HOST"),
        "PGPORT": settings.get("PORT"),
        "PGUSER": settings.get("USER"),
        "PGPASSWORD": settings.get("PASSWORD"),
        "PGDATABASE": settings.get("NAME"),
    }
    return {**os.environ, **{k: str(v) for k, v in pairs.items() if v}}


def _run(command: list[str], alias: str) -> None:
    if shutil.which(command[0]) is None:
        raise BackupError(
            f"{command[0]} is not installed (Debian: apt-get install postgresql-client)"
        )
    done = subprocess.run(command, env=_pg_env(alias), capture_output=True, text=True)  # noqa: S603
    if done.returncode != 0:
        raise BackupError(f"{command[0]} failed: {done.stderr.strip()[-2000:]}")


def _pg_prepare(alias: str) -> str:
    """Create the target database when missing; refuse one that holds tables. Its name."""
    settings = connections[alias].settings_dict
    params: dict[str, Any] = {
        "host": settings.get("HOST") or None,
        "port": settings.get("PORT") or None,
        "user": settings.get("USER") or None,
        "password": settings.get("PASSWORD") or None,
    }
    name = settings["NAME"]
    with psycopg.connect(dbname="postgres", autocommit=True, **params) as admin:
        exists = admin.execute("SELECT 1 FROM pg_database WHERE datname = %s", [name]).fetchone()
        if not exists:
            admin.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
            return str(name)
    with psycopg.connect(dbname=name, **params) as target:
        row = target.execute(
            "SELECT count(*) FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace"
            " WHERE c.relkind IN ('r', 'p')"
            " AND n.nspname NOT IN ('pg_catalog', 'information_schema')"
        ).fetchone()
    if row and row[0]:
        raise BackupError(
            f"database {name!r} is not empty ({row[0]} tables): restore into a fresh database"
        )
    return str(name)


# --- SQLite ----------------------------------------------------------------------------------


def _sqlite_connection(alias: str) -> sqlite3.Connection:
    connection = connections[alias]
    connection.ensure_connection()
    raw = connection.connection
    assert isinstance(raw, sqlite3.Connection)
    return raw


def _sqlite_copy(source: sqlite3.Connection, path: Path) -> None:
    path.unlink(missing_ok=True)
    target = sqlite3.connect(path)
    try:
        source.backup(target)
        # One self-contained file: the copy's pages all in it, no WAL beside it.
        target.execute("PRAGMA journal_mode=DELETE")
    finally:
        target.close()


def _sqlite_restore(path: Path, target_path: Path) -> None:
    if target_path.exists() and _sqlite_tables(target_path):
        raise BackupError(
            f"database {str(target_path)!r} is not empty: restore into a fresh database"
        )
    source = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    target = sqlite3.connect(target_path)
    try:
        source.backup(target)
    finally:
        source.close()
        target.close()


def _sqlite_tables(path: Path) -> int:
    probe = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        return int(
            probe.execute("SELECT count(*) FROM sqlite_master WHERE type='table'").fetchone()[0]
        )
    finally:
        probe.close()
