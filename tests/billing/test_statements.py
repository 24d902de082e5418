"""Statements and the two reconciliations, on a small cluster with the arithmetic worked out.

The cluster: node n1 with 4 H100 (available) and node n2 with 2 H100, cordoned (unavailable).
Guarantees (GPUs): acme 4 > research 3 (team-alpha 2, team-bravo 1), product 1 (team-charlie 1).
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from decimal import Decimal
from fractions import Fraction
from typing import Any

import pytest
from django.db import DatabaseError, transaction

from billing.metering.hourly import meter_usage
from billing.models import BillingPolicy, Statement, StatementLine
from billing.rates.cards import RatePrices, rate_card_add
from billing.statements.closing import statement_adjust, statement_close
from billing.statements.reconciliation import cluster_reconciliation
from billing.statements.rollup import organisation_lines, roll_up
from common.errors import DomainError
from scheduler.models import JobEvent, JobState
from tenants.models import Quota
from tests.billing.builders import T0, at, hold, job_for, make_node
from tests.concurrency import rendezvous, run_in_threads
from tests.conftest import Org, build_org

# Leaves first: a parent's guarantee must hold its children's at every step.
GUARANTEES = {"team-alpha": 2, "team-bravo": 1, "team-charlie": 1, "research": 3, "product": 1}


def cluster(org: Org, metered_at: datetime | None = None) -> None:
    pat = org.users["pat"]
    for slug, gpus in {**GUARANTEES, "acme": 4}.items():
        Quota.objects.filter(tenant__slug=slug, flavor=org.h100).update(
            guaranteed_milli=gpus * 1000, limit_milli=64000
        )
    # 2.00 a GPU-hour, 3.00 from hour 2 on.
    rate_card_add(
        user=pat, flavor=org.h100, valid_from=T0 - timedelta(days=30), prices=RatePrices(Decimal(2))
    )
    rate_card_add(user=pat, flavor=org.h100, valid_from=at(2), prices=RatePrices(Decimal(3)))
    n1 = make_node("n1", gpus=4)
    n2 = make_node("n2", gpus=2)
    n2.cordoned = True
    n2.save()
    alice, bob = job_for(org), job_for(org, "bob-bravo", project=org.proj_bravo)
    chris = job_for(org, "chris", project=org.proj_charlie, state=JobState.FAILED)
    hold(alice, n1, 0, 3, [1000])  # device 0, hours 0-3
    hold(bob, n1, 0.5, 1.5, [500], first_device=1)  # half of device 1, preempted at 1.5
    preempt = JobEvent.objects.create(
        job=bob, kind="state", from_state=JobState.RUNNING, to_state=JobState.PREEMPTED
    )
    JobEvent.objects.filter(pk=preempt.pk).update(at=at(1.5))
    hold(chris, n1, 1, 2, [1000], first_device=2)  # device 2, failed at 2
    failed = JobEvent.objects.create(
        job=chris, kind="state", from_state=JobState.RUNNING, to_state=JobState.FAILED
    )
    JobEvent.objects.filter(pk=failed.pk).update(at=at(2))
    draining = job_for(org, replicas=1)
    hold(draining, n2, 0, 1, [250])  # a quarter of a cordoned device, hour 0
    if metered_at is not None:
        meter_usage(now=metered_at)
        return
    assert meter_usage(now=at(5)) == 4  # hours 0..3 (hour 4 ends less than the delay ago)


def by_kind(lines: list[Any]) -> dict[tuple[str, str], Decimal]:
    out: dict[tuple[str, str], Decimal] = {}
    for d in lines:
        key = (d.line.kind, str(d.line.account[0]))
        out[key] = out.get(key, Decimal(0)) + d.line.amount
    return out


def test_hour_zero_worked_out(org: Org) -> None:
    cluster(org)
    lines = organisation_lines(org.acme, T0, at(1))
    got = {(d.line.kind, d.line.account[0], d.line.resource): d.line.amount for d in lines}
    # Used, at 2.00: alice 1 GPU-hour on n1 + 0.25 on n2 = 2.00 + 0.50 (two lines of one
    # account merge: same flavor, resource, kind and price) -> 2.50; bob 500 milli for half an
    # hour = 0.25 GPU-hour -> 0.50, preempted.
    assert got[("used", org.alpha.pk, "gpu")] == Decimal("2.50")
    assert got[("preempted", org.bravo.pk, "gpu")] == Decimal("0.50")
    # Idle reserved. Used by subtree (GPU-hours): alpha 1.25, bravo 0.25, charlie 0.
    # Unused guarantees: alpha 2 - 1.25 = 0.75, bravo 1 - 0.25 = 0.75, charlie 1, research
    # 3 - 1.5 = 1.5 (= its children's 0.75 + 0.75: no own claim), product 1 (= charlie's),
    # acme 4 - 1.5 = 2.5 (= 1.5 + 1). Idle devices: 6 present - 1.5 used - 1.75 unavailable
    # (n2: 2 - 0.25) = 2.75 >= 2.5, so all 2.5 of unused guarantee is idle reserved:
    # alpha 0.75 x 2.00 = 1.50, bravo 0.75 x 2.00 = 1.50, charlie 1 x 2.00 = 2.00.
    assert got[("idle-reserved", org.alpha.pk, "gpu")] == Decimal("1.50")
    assert got[("idle-reserved", org.bravo.pk, "gpu")] == Decimal("1.50")
    assert got[("idle-reserved", org.charlie.pk, "gpu")] == Decimal("2.00")
    assert len(got) == 5
    [h100] = cluster_reconciliation(T0, at(1))
    # Capacity 6 GPU-hours x 2.00 = 12.00 = used 1.5 (3.00) + idle reserved 2.5 (5.00)
    # + unreserved idle 0.25 (0.50) + unavailable 1.75 (3.50).
    assert h100.gpu_hours == {
        "used": Fraction(3, 2),
        "idle_reserved": Fraction(5, 2),
        "unreserved_idle": Fraction(1, 4),
        "unavailable": Fraction(7, 4),
    }
    assert h100.capacity == Decimal("12.00")
    assert h100.amounts == {
        "used": Decimal("3.00"),
        "idle_reserved": Decimal("5.00"),
        "unreserved_idle": Decimal("0.50"),
        "unavailable": Decimal("3.50"),
    }


def test_failed_attempts_have_their_own_lines_across_a_rate_change(org: Org) -> None:
    cluster(org)
    got = by_kind(organisation_lines(org.acme, T0, at(4)))
    # chris held device 2 in hour 1 (at 2.00): 2.00, failed.
    assert got[("failed", str(org.charlie.pk))] == Decimal("2.00")
    # alice: hours 0 and 1 at 2.00, hour 2 at 3.00, + 0.25 on n2 at 2.00 -> 2 + 2 + 3 + 0.5
    assert got[("used", str(org.alpha.pk))] == Decimal("7.50")


def test_the_leaves_add_up_to_the_root_to_the_cent(org: Org) -> None:
    cluster(org)
    lines = organisation_lines(org.acme, T0, at(4))
    totals = roll_up((d.line.account[0], d.line.amount, d.charged) for d in lines)
    leaves = sum((d.line.amount for d in lines if d.charged), Decimal(0))
    assert totals[org.acme.pk].charged == leaves
    for parent, children in [
        (org.acme, [org.research, org.product]),
        (org.research, [org.alpha, org.bravo]),
        (org.product, [org.charlie]),
    ]:
        own = sum((d.line.amount for d in lines if d.line.account[0] == parent.pk), Decimal(0))
        below = sum((totals[c.pk].charged for c in children if c.pk in totals), Decimal(0))
        assert totals[parent.pk].charged == own + below, parent.slug


def test_the_cluster_reconciles_to_the_cent(org: Org) -> None:
    cluster(org)
    [h100] = cluster_reconciliation(T0, at(4))
    assert h100.reconciled
    # Capacity: 6 devices x (2 h at 2.00 + 2 h at 3.00) = 6 x 10.00 = 60.00.
    assert h100.capacity == Decimal("60.00")
    assert h100.capacity_held == 6 * 4 * 3_600_000
    # Used equals what the statements metered (every kind, every account), GPU-hour for
    # GPU-hour; idle reserved equals the idle reserved lines.
    lines = organisation_lines(org.acme, T0, at(4))
    metered = sum(
        (
            d.line.exact
            for d in lines
            if d.line.resource == "gpu" and d.line.kind != "idle-reserved"
        ),
        Fraction(0),
    )
    idle = sum((d.line.exact for d in lines if d.line.kind == "idle-reserved"), Fraction(0))
    assert h100.gpu_hours["used"] == metered
    assert h100.gpu_hours["idle_reserved"] == idle


@pytest.mark.parametrize("policy", ["charge", "showback", "spread"])
def test_the_idle_policy_decides_where_idle_reserved_capacity_goes(org: Org, policy: str) -> None:
    cluster(org)
    BillingPolicy.objects.create(organisation=org.acme, idle_policy=policy)
    lines = [d for d in organisation_lines(org.acme, T0, at(1)) if d.line.kind == "idle-reserved"]
    total = sum((d.line.amount for d in lines), Decimal(0))
    assert total == Decimal("5.00")  # 2.5 GPU-hours x 2.00, whoever carries it
    if policy == "charge":
        assert {d.line.account for d in lines} == {
            (org.alpha.pk, None, None),
            (org.bravo.pk, None, None),
            (org.charlie.pk, None, None),
        }
        assert all(d.charged for d in lines)
    elif policy == "showback":
        assert not any(d.charged for d in lines)
    else:
        # Spread over the users who held GPUs, by GPU-hours: alice 1.25, bob 0.25 of 1.5:
        # 5.00 x 5/6 = 4.1666.. -> 4.17, 5.00 x 1/6 = 0.8333.. -> 0.83.
        got = {d.line.account[2]: d.line.amount for d in lines}
        assert got == {
            org.users["alice"].pk: Decimal("4.17"),
            org.users["bob-bravo"].pk: Decimal("0.83"),
        }


def test_a_period_not_metered_cannot_close(org: Org) -> None:
    cluster(org)
    with pytest.raises(DomainError, match="not metered completely"):
        statement_close(
            user=org.users["pat"], organisation=org.acme, start=T0, end=at(6), now=at(5)
        )


def test_an_hour_within_the_metering_delay_is_not_closed(org: Org) -> None:
    # At 00:01 the hour 23:00-00:00 has ended but is not metered yet (the delay): January
    # cannot close until it is.
    cluster(org, metered_at=at(4) + timedelta(minutes=1))
    with pytest.raises(DomainError, match="first hour missing: 2031-01-31T23:00:00Z"):
        statement_close(
            user=org.users["pat"],
            organisation=org.acme,
            start=T0,
            end=at(4),
            now=at(4) + timedelta(minutes=1),
        )


def test_closing_is_idempotent_and_freezes_the_lines(org: Org) -> None:
    cluster(org)
    pat = org.users["pat"]
    first = statement_close(user=pat, organisation=org.acme, start=T0, end=at(4), now=at(5))
    again = statement_close(user=pat, organisation=org.acme, start=T0, end=at(4), now=at(6))
    assert first.pk == again.pk
    count = StatementLine.objects.filter(statement=first).count()
    assert count == len(organisation_lines(org.acme, T0, at(4)))
    line = StatementLine.objects.filter(statement=first).first()
    assert line is not None
    with pytest.raises(DatabaseError, match="append-only"), transaction.atomic():
        StatementLine.objects.filter(pk=line.pk).update(amount=Decimal("0.01"))
    with pytest.raises(DatabaseError, match="append-only"), transaction.atomic():
        StatementLine.objects.filter(pk=line.pk).delete()
    with pytest.raises(DatabaseError, match="append-only"), transaction.atomic():
        Statement.objects.filter(pk=first.pk).update(closed_at=at(9))
    assert StatementLine.objects.filter(statement=first).count() == count


def test_a_correction_is_an_adjustment_line_with_a_reason_and_an_author(org: Org) -> None:
    cluster(org)
    pat = org.users["pat"]
    statement = statement_close(user=pat, organisation=org.acme, start=T0, end=at(4), now=at(5))
    before = roll_up(statement.lines.values_list("tenant_id", "amount", "charged"))
    line = statement_adjust(
        user=pat,
        statement=statement,
        tenant=org.charlie,
        amount=Decimal("-2.00"),
        reason="failed attempt: a faulty node, not the team's job",
    )
    assert (line.kind, line.author_id, line.amount) == ("adjustment", pat.pk, Decimal("-2.00"))
    after = roll_up(statement.lines.values_list("tenant_id", "amount", "charged"))
    assert after[org.acme.pk].charged == before[org.acme.pk].charged - 2
    from django.core.exceptions import ValidationError

    with pytest.raises(ValidationError) as info:
        statement_adjust(
            user=pat, statement=statement, tenant=org.charlie, amount=Decimal("1.005"), reason=" "
        )
    assert set(info.value.message_dict) == {"amount", "reason"}


@pytest.mark.postgresql("two closes racing: PostgreSQL lets both compute before one commits")
def test_concurrent_closes_make_one_statement(transactional_db: Any, monkeypatch: Any) -> None:
    from billing.statements import closing

    org = build_org()
    cluster(org)
    meet = rendezvous(2)
    original = closing.organisation_lines

    def lines_then_wait(*args: Any) -> Any:
        lines = original(*args)
        meet()  # both have found no statement and computed its lines
        return lines

    monkeypatch.setattr(closing, "organisation_lines", lines_then_wait)
    pat = org.users["pat"]

    def close() -> int:
        return statement_close(user=pat, organisation=org.acme, start=T0, end=at(4), now=at(5)).pk

    results = run_in_threads(close, close)
    assert [kind for kind, _ in results] == ["ok", "ok"], results
    assert results[0][1] == results[1][1]
    assert Statement.objects.count() == 1
    assert StatementLine.objects.count() == len(original(org.acme, T0, at(4)))


def test_a_month_is_one_period_from_its_first_hour(org: Org) -> None:
    assert at(4) == datetime(2031, 2, 1, tzinfo=UTC)  # the cluster's hours straddle a month end


def test_a_lost_sqlite_trigger_is_put_back_by_migrate(db: Any) -> None:
    from django.core.management import call_command
    from django.db import connection

    from billing.statements.guards import SQLITE

    if connection.vendor != "sqlite":
        pytest.skip("SQLite only: PostgreSQL keeps triggers across table rebuilds")
    with connection.cursor() as cursor:
        cursor.execute("DROP TRIGGER billing_statementline_frozen_update")
    call_command("migrate", verbosity=0)
    with connection.cursor() as cursor:
        cursor.execute("SELECT name FROM sqlite_master WHERE type = 'trigger'")
        present = {name for (name,) in cursor.fetchall()}
    assert set(SQLITE) <= present


def test_close_month_closes_every_organisation_once(org: Org, monkeypatch: Any) -> None:
    from django.core.management import call_command

    from billing.management.commands import close_month

    cluster(org)
    assert close_month.month_bounds("2031-12") == (
        datetime(2031, 12, 1, tzinfo=UTC),
        datetime(2032, 1, 1, tzinfo=UTC),
    )
    # Close the hours metered so far, as if January 2031 were [T0, at(4)).
    monkeypatch.setattr(close_month, "month_bounds", lambda text: (T0, at(4)))
    call_command("close_month", "2031-01", "--now", at(5).isoformat())
    call_command("close_month", "2031-01", "--now", at(6).isoformat())
    assert list(Statement.objects.values_list("organisation__slug", flat=True)) == ["acme"]
