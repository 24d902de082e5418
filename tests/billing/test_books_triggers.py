"""What the database refuses of the books, with raw SQL, on SQLite (the default) and on
PostgreSQL (DATABASE_URL): a plain line into a closed statement, and any change to a rate
card version that priced metered hours (billing/statements/guards.py)."""

from __future__ import annotations

from datetime import datetime, timedelta
from decimal import Decimal
from typing import Any

import pytest
from django.db import DatabaseError, connection, transaction

from billing.models import RateCard, Statement, StatementLine, StatementSeal
from billing.statements.closing import statement_adjust, statement_close
from billing.statements.rollup import organisation_lines
from tests.billing.builders import T0, at
from tests.billing.test_statements import cluster
from tests.conftest import Org


def sql(statement: str, params: list[Any]) -> None:
    """One raw statement in a savepoint (a refused one leaves the test's transaction
    usable on PostgreSQL); instants written as the ORM writes them."""
    adapt = connection.ops.adapt_datetimefield_value
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(statement, [adapt(p) if isinstance(p, datetime) else p for p in params])


def insert_line(statement: Statement, tenant_id: int, kind: str, author_id: int | None) -> None:
    sql(
        "INSERT INTO billing_statementline (statement_id, tenant_id, flavor, resource, kind,"
        " unit, quantity, rate, amount, charged, split, reason, author_id, created_at)"
        " VALUES (%s, %s, 'H100-80GB', 'gpu', %s, 'gpu-hour', 1, 2, 2.00, %s, '[]', %s, %s, %s)",
        [
            statement.pk,
            tenant_id,
            kind,
            True,
            "late usage" if author_id else "",
            author_id,
            at(5),
        ],
    )


def test_only_an_adjustment_goes_into_a_closed_statement(org: Org) -> None:
    cluster(org)
    pat = org.users["pat"]
    statement = statement_close(user=pat, organisation=org.acme, start=T0, end=at(4), now=at(5))
    assert StatementSeal.objects.filter(statement=statement).exists()
    lines = StatementLine.objects.filter(statement=statement).count()
    assert lines == len(organisation_lines(org.acme, T0, at(4)))
    with pytest.raises(DatabaseError, match="closed statement"):
        insert_line(statement, org.alpha.pk, "used", None)
    with pytest.raises(DatabaseError, match="closed statement"):
        insert_line(statement, org.alpha.pk, "idle-reserved", None)
    assert StatementLine.objects.filter(statement=statement).count() == lines
    # The adjustment service's way in (raw or through the service) is still open.
    insert_line(statement, org.alpha.pk, "adjustment", pat.pk)
    statement_adjust(
        user=pat, statement=statement, tenant=org.alpha, amount=Decimal("-1.00"), reason="x"
    )
    assert StatementLine.objects.filter(statement=statement).count() == lines + 2
    # The seal itself cannot be lifted.
    with pytest.raises(DatabaseError, match="append-only"):
        sql("DELETE FROM billing_statementseal WHERE statement_id = %s", [statement.pk])
    with pytest.raises(DatabaseError, match="append-only"):
        sql("UPDATE billing_statementseal SET sealed_at = %s", [at(9)])


def _used_card() -> RateCard:
    # 2.00 from T0 - 30 days to hour 2: hours 0 and 1 are metered with it.
    return RateCard.objects.get(valid_to=at(2))


def test_a_rate_version_that_priced_metered_hours_is_immutable(org: Org) -> None:
    cluster(org)  # hours 0-3 metered
    used = _used_card()
    for statement, params in (
        ("UPDATE billing_ratecard SET gpu_hour = 9 WHERE id = %s", [used.pk]),
        ("UPDATE billing_ratecard SET valid_from = %s WHERE id = %s", [at(1), used.pk]),
        # An end moved back over metered hours.
        ("UPDATE billing_ratecard SET valid_to = %s WHERE id = %s", [at(1), used.pk]),
        ("DELETE FROM billing_ratecard WHERE id = %s", [used.pk]),
    ):
        with pytest.raises(DatabaseError, match="rate card version"):
            sql(statement, params)
    with pytest.raises(DatabaseError, match="multiplier"):
        sql(
            "INSERT INTO billing_ratemultiplier (rate_card_id, priority_class_id, multiplier)"
            " SELECT %s, id, 3 FROM tenants_priorityclass WHERE name = 'high'",
            [used.pk],
        )
    used.refresh_from_db()
    assert (used.gpu_hour, used.valid_to) == (Decimal(2), at(2))
    # The open end of the last version may still be closed where nothing is metered (the
    # next version appended), and a version no metered hour fell in stays editable.
    last = RateCard.objects.get(valid_to__isnull=True)
    sql("UPDATE billing_ratecard SET valid_to = %s WHERE id = %s", [at(10), last.pk])
    sql(
        "INSERT INTO billing_ratecard (flavor_id, valid_from, valid_to, currency, gpu_hour,"
        " cpu_core_hour, memory_gib_hour, borrowed_discount, created_at)"
        " VALUES (%s, %s, NULL, 'EUR', 4, 0, 0, 0, %s)",
        [org.h100.pk, at(10), at(5)],
    )
    future = RateCard.objects.get(valid_from=at(10))
    sql("UPDATE billing_ratecard SET gpu_hour = 5 WHERE id = %s", [future.pk])
    sql("DELETE FROM billing_ratecard WHERE id = %s", [future.pk])
    assert RateCard.objects.filter(pk=last.pk, valid_to=at(10)).exists()
    # Not before it: hour 3 is metered with the last version.
    with pytest.raises(DatabaseError, match="rate card version"):
        sql("UPDATE billing_ratecard SET valid_to = %s WHERE id = %s", [at(3), last.pk])


def test_a_version_not_in_force_yet_is_withdrawn_as_before(org: Org) -> None:
    from billing.rates.cards import RatePrices, rate_card_add, rate_card_withdraw

    cluster(org)
    pat = org.users["pat"]
    later = rate_card_add(
        user=pat, flavor=org.h100, valid_from=at(24 * 3), prices=RatePrices(Decimal(4))
    )
    rate_card_withdraw(user=pat, rate_card=later, now=at(5) + timedelta(minutes=1))
    assert RateCard.objects.get(valid_to__isnull=True).valid_from == at(2)
