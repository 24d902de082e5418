"""What the books refuse at the database, on PostgreSQL and on SQLite:

1. Closed statements are frozen: UPDATE and DELETE of a statement, its lines and its seal.
2. A sealed statement takes no line but an adjustment: the close writes the lines, then the
   seal (billing/models/books.py), in one transaction; after it, only `closing.statement_adjust`
   appends (adjustment lines, with their reason and author: a check constraint).
3. A rate card version that priced a metered hour is immutable: UPDATE and DELETE refused,
   but for moving its end to an hour not metered yet (appending the next version closes the
   open end of the last one), and its priority multipliers can be neither added, changed
   nor removed. A metered hour in its span is what makes it used: the hour's usage, idle
   reserved capacity and budgets' spend were priced with it.

Nothing in the application changes these rows; the triggers are the backstop against a
stray ORM call, a shell session or a bug. TRUNCATE (PostgreSQL's test teardown) is not
affected.

On SQLite a migration that rebuilds a table drops its triggers (scheduler/nodes/triggers.py tells
that story), so `ensure_triggers` runs after every `migrate` (post_migrate) as well as in
the migrations that add them, and puts back any that is missing. A group whose tables do
not exist yet (an early migration) is left for later.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, NamedTuple

from common.db.sqlite_triggers import install_missing

# The frozen tables of migration 0004 (its reverse reads these names).
TABLES = ("billing_statement", "billing_statementline")
SEALS = "billing_statementseal"

_REFUSE_CHANGE = """
CREATE OR REPLACE FUNCTION billing_refuse_change() RETURNS trigger AS $$
BEGIN
    RAISE EXCEPTION '% of a closed statement refused: % is append-only', TG_OP, TG_TABLE_NAME
        USING ERRCODE = 'integrity_constraint_violation';
END;
$$ LANGUAGE plpgsql;
"""

POSTGRESQL = _REFUSE_CHANGE + "".join(
    f"""
DROP TRIGGER IF EXISTS {table}_frozen ON {table};
CREATE TRIGGER {table}_frozen BEFORE UPDATE OR DELETE ON {table}
    FOR EACH ROW EXECUTE FUNCTION billing_refuse_change();
"""
    for table in TABLES
)

SQLITE = {
    f"{table}_frozen_{op.lower()}": f"""
        CREATE TRIGGER {table}_frozen_{op.lower()} BEFORE {op} ON {table}
        BEGIN SELECT RAISE(ABORT, '{op} of a closed statement refused: {table} is append-only');
        END;"""
    for table in TABLES
    for op in ("UPDATE", "DELETE")
}

_SEALED = f"EXISTS (SELECT 1 FROM {SEALS} s WHERE s.statement_id = NEW.statement_id)"  # noqa: S608

POSTGRESQL_SEALED = (
    _REFUSE_CHANGE
    + f"""
CREATE OR REPLACE FUNCTION billing_refuse_line_after_seal() RETURNS trigger AS $$
BEGIN
    IF NEW.kind <> 'adjustment' AND {_SEALED} THEN
        RAISE EXCEPTION 'a % line into closed statement % refused: only adjustments are added',
            NEW.kind, NEW.statement_id USING ERRCODE = 'integrity_constraint_violation';
    END IF;
    RETURN NEW;
END;
$$ LANGUAGE plpgsql;
DROP TRIGGER IF EXISTS billing_statementline_sealed ON billing_statementline;
CREATE TRIGGER billing_statementline_sealed BEFORE INSERT ON billing_statementline
    FOR EACH ROW EXECUTE FUNCTION billing_refuse_line_after_seal();
DROP TRIGGER IF EXISTS {SEALS}_frozen ON {SEALS};
CREATE TRIGGER {SEALS}_frozen BEFORE UPDATE OR DELETE ON {SEALS}
    FOR EACH ROW EXECUTE FUNCTION billing_refuse_change();
"""
)

SQLITE_SEALED = {
    "billing_statementline_sealed": f"""
        CREATE TRIGGER billing_statementline_sealed BEFORE INSERT ON billing_statementline
        WHEN NEW.kind <> 'adjustment' AND {_SEALED}
        BEGIN SELECT RAISE(ABORT, 'a line into a closed statement refused: only adjustments');
        END;""",
    **{
        f"{SEALS}_frozen_{op.lower()}": f"""
        CREATE TRIGGER {SEALS}_frozen_{op.lower()} BEFORE {op} ON {SEALS}
        BEGIN SELECT RAISE(ABORT, '{op} of a closed statement refused: {SEALS} is append-only');
        END;"""
        for op in ("UPDATE", "DELETE")
    },
}


def _metered_in(card: str, cut: bool = False, *, sqlite: bool = False) -> str:
    """SQL: a metered hour inside the span of the version `card` (OLD, NEW or an alias);
    `cut`: one that NEW's end leaves out. SQLite compares instants as julianday numbers:
    its datetimes are text, written by Django as '2031-01-31 20:00:00' but by a raw
    statement in any ISO 8601 form."""

    def t(expression: str) -> str:
        return f"julianday({expression})" if sqlite else expression

    extra = f" AND NEW.valid_to IS NOT NULL AND {t('p.start')} >= {t('NEW.valid_to')}"
    return (
        f"EXISTS (SELECT 1 FROM billing_meteringperiod p WHERE {t('p.start')} >= "  # noqa: S608
        f"{t(f'{card}.valid_from')} AND ({card}.valid_to IS NULL OR {t('p.start')} < "
        f"{t(f'{card}.valid_to')}){extra if cut else ''})"
    )


def _card_of(row: str, *, sqlite: bool = False) -> str:
    """SQL: the version of the multiplier `row` has priced a metered hour."""
    return (
        f"EXISTS (SELECT 1 FROM billing_ratecard c WHERE c.id = {row}.rate_card_id AND "  # noqa: S608
        f"{_metered_in('c', sqlite=sqlite)})"
    )


_PRICED = (
    "flavor_id", "valid_from", "currency", "gpu_hour", "cpu_core_hour", "memory_gib_hour",
    "borrowed_discount", "created_by_id", "created_at", "id",
)  # fmt: skip
# Priced too since billing 0017 (rate cards per cluster). Earlier migrations install these
# triggers before the column exists: `_without_cluster` leaves its comparison out then (a
# trigger naming a column its table lacks breaks SQLite's every ALTER TABLE, and
# PostgreSQL's every UPDATE of a rate card).
_CLUSTER = "cluster_id"
_USED = _metered_in("OLD")
_CUT = _metered_in("OLD", cut=True)
_USED_SQLITE = _metered_in("OLD", sqlite=True)
_CUT_SQLITE = _metered_in("OLD", cut=True, sqlite=True)


def _changed(distinct: str) -> str:
    return " OR ".join(f"NEW.{column} {distinct} OLD.{column}" for column in (*_PRICED, _CLUSTER))


def _without_cluster(sql: str) -> str:
    """`sql` with the comparison of the rate card's cluster left out."""
    for distinct in ("IS DISTINCT FROM", "IS NOT"):
        sql = sql.replace(f" OR NEW.{_CLUSTER} {distinct} OLD.{_CLUSTER}", "")
    return sql


POSTGRESQL_RATES = f"""
CREATE OR REPLACE FUNCTION billing_refuse_used_rate() RETURNS trigger AS $$
BEGIN
    IF TG_OP = 'DELETE' THEN
        IF {_USED} THEN
            RAISE EXCEPTION 'DELETE of rate card version % refused: it priced metered hours',
                OLD.id USING ERRCODE = 'integrity_constraint_violation';
        END IF;
        RETURN OLD;
    END IF;
    IF ({_changed("IS DISTINCT FROM")} OR {_CUT}) AND {_USED} THEN
        RAISE EXCEPTION 'UPDATE of rate card version % refused: it priced metered hours',
            OLD.id USING ERRCODE = 'integrity_constraint_violation';
    END IF;
    RETURN NEW;
END;
$$ LANGUAGE plpgsql;
CREATE OR REPLACE FUNCTION billing_refuse_used_multiplier() RETURNS trigger AS $$
BEGIN
    IF (TG_OP <> 'INSERT' AND {_card_of("OLD")})
        OR (TG_OP <> 'DELETE' AND {_card_of("NEW")}) THEN
        RAISE EXCEPTION
            '% of a multiplier of a rate card version that priced metered hours refused',
            TG_OP USING ERRCODE = 'integrity_constraint_violation';
    END IF;
    RETURN COALESCE(NEW, OLD);
END;
$$ LANGUAGE plpgsql;
DROP TRIGGER IF EXISTS billing_ratecard_used ON billing_ratecard;
CREATE TRIGGER billing_ratecard_used BEFORE UPDATE OR DELETE ON billing_ratecard
    FOR EACH ROW EXECUTE FUNCTION billing_refuse_used_rate();
DROP TRIGGER IF EXISTS billing_ratemultiplier_used ON billing_ratemultiplier;
CREATE TRIGGER billing_ratemultiplier_used BEFORE INSERT OR UPDATE OR DELETE
    ON billing_ratemultiplier FOR EACH ROW EXECUTE FUNCTION billing_refuse_used_multiplier();
"""

_USED_MESSAGE = "of a rate card version that priced metered hours refused"
SQLITE_RATES = {
    "billing_ratecard_used_update": f"""
        CREATE TRIGGER billing_ratecard_used_update BEFORE UPDATE ON billing_ratecard
        WHEN ({_changed("IS NOT")} OR {_CUT_SQLITE}) AND {_USED_SQLITE}
        BEGIN SELECT RAISE(ABORT, 'UPDATE {_USED_MESSAGE}'); END;""",
    "billing_ratecard_used_delete": f"""
        CREATE TRIGGER billing_ratecard_used_delete BEFORE DELETE ON billing_ratecard
        WHEN {_USED_SQLITE}
        BEGIN SELECT RAISE(ABORT, 'DELETE {_USED_MESSAGE}'); END;""",
    **{
        f"billing_ratemultiplier_used_{op.lower()}": f"""
        CREATE TRIGGER billing_ratemultiplier_used_{op.lower()} BEFORE {op}
        ON billing_ratemultiplier WHEN {_card_of(row, sqlite=True)}
        BEGIN SELECT RAISE(ABORT, '{op} of a multiplier {_USED_MESSAGE}'); END;"""
        for op, row in (("INSERT", "NEW"), ("UPDATE", "OLD"), ("DELETE", "OLD"))
    },
}


class Group(NamedTuple):
    tables: tuple[str, ...]
    postgresql: str
    sqlite: dict[str, str]


GROUPS = (
    Group(TABLES, POSTGRESQL, SQLITE),
    Group((*TABLES, SEALS), POSTGRESQL_SEALED, SQLITE_SEALED),
    Group(
        ("billing_ratecard", "billing_ratemultiplier", "billing_meteringperiod"),
        POSTGRESQL_RATES,
        SQLITE_RATES,
    ),
)


def ensure_triggers(connection: Any) -> list[str]:
    """Install the triggers that are missing, of each group whose tables exist; the names
    installed (all of those groups', on PostgreSQL, where they are replaced)."""
    installed: list[str] = []
    present = set(connection.introspection.table_names())
    for group in GROUPS:
        if not set(group.tables) <= present:
            continue
        postgresql, sqlite = group.postgresql, group.sqlite
        if "billing_ratecard" in group.tables and not _has_cluster(connection):
            postgresql = _without_cluster(postgresql)
            sqlite = {name: _without_cluster(sql) for name, sql in sqlite.items()}
        if connection.vendor == "postgresql":
            with connection.cursor() as cursor:
                cursor.execute(postgresql)
            installed += list(sqlite)
        else:
            installed += install_missing(connection, list(group.tables), sqlite)
    return installed


def _has_cluster(connection: Any) -> bool:
    with connection.cursor() as cursor:
        columns = connection.introspection.get_table_description(cursor, "billing_ratecard")
    return any(column.name == _CLUSTER for column in columns)


@contextmanager
def lifted(connection: Any) -> Iterator[None]:
    """Every trigger of the books dropped for the block, put back after it: for a test's
    teardown that deletes every row (SQLite's flush), never for the application."""
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            cursor.execute(
                "SELECT t.tgname, c.relname FROM pg_trigger t JOIN pg_class c ON c.oid = t.tgrelid"
                " WHERE NOT t.tgisinternal AND c.relname LIKE 'billing%%'"
            )
            for name, table in cursor.fetchall():
                cursor.execute(f'DROP TRIGGER IF EXISTS "{name}" ON "{table}"')
        else:
            for name in (name for group in GROUPS for name in group.sqlite):
                cursor.execute(f"DROP TRIGGER IF EXISTS {name}")
    try:
        yield
    finally:
        ensure_triggers(connection)
