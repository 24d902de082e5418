"""Budgets: spend from metering, reservations at admission, the policies at 100 %, alerts.

The month is February 2031 (the builders' T0 is 2031-01-31 20:00, so at(4) is 1 February
00:00). H100 costs 4.00 a GPU-hour (no CPU or memory price), A100 2.00.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any

from billing.budgets import budget_position
from billing.metering import meter_usage
from billing.models import Budget, BudgetUnit
from billing.rates import RatePrices, rate_card_add
from tests.billing.builders import T0, at, hold, job_for, make_node
from tests.conftest import Org

FEB = datetime(2031, 2, 1, tzinfo=UTC)


def rates(org: Org) -> None:
    start = T0 - timedelta(days=2)
    rate_card_add(
        user=org.users["pat"], flavor=org.h100, valid_from=start, prices=RatePrices(Decimal(4))
    )
    rate_card_add(
        user=org.users["pat"], flavor=org.a100, valid_from=start, prices=RatePrices(Decimal(2))
    )


def budget(tenant: Any, limit: str, **kw: Any) -> Budget:
    return Budget.objects.create(
        tenant=tenant, month=kw.pop("month", FEB), limit=Decimal(limit), **kw
    )


# --- spend ---------------------------------------------------------------------------------


def test_spend_is_what_the_subtree_was_metered_for_in_the_month_worked_out(org: Org) -> None:
    rates(org)
    budget(org.research, "100")
    budget(org.alpha, "40")
    budget(org.bravo, "3", unit=BudgetUnit.GPU_HOURS)
    node = make_node()
    # alpha: 2 GPUs from 31 Jan 22:00 to 1 Feb 02:00: 2 h in January, 2 h in February.
    hold(job_for(org), node, 2, 6, [1000, 1000])
    # bravo: half a GPU for 1 h 30 in February.
    hold(job_for(org, "bob-bravo", project=org.proj_bravo), node, 4, 5.5, [500], first_device=2)
    # charlie (another department): 1 GPU for 1 h; not research's.
    hold(job_for(org, "chris", project=org.proj_charlie), node, 4, 5, [1000], first_device=3)
    meter_usage(now=at(7))
    alpha = budget_position(org.alpha, at(6))
    assert alpha is not None
    # 2 GPUs x 2 h x 4.00 = 16.00; January's hours are January's.
    assert (alpha.spent, alpha.committed, alpha.remaining) == (
        Decimal("16.00"),
        0,
        Decimal("24.00"),
    )
    assert alpha.percent == Decimal("40.0") and alpha.month == FEB
    research = budget_position(org.research, at(6))
    assert research is not None
    # alpha 16.00 + bravo 0.5 GPU x 1.5 h x 4.00 = 3.00: 19.00 of 100.
    assert (research.spent, research.percent) == (Decimal("19.00"), Decimal("19.0"))
    bravo = budget_position(org.bravo, at(6))
    assert bravo is not None and bravo.unit == BudgetUnit.GPU_HOURS
    assert (bravo.spent, bravo.percent) == (Decimal("0.75"), Decimal("25.0"))  # 0.5 x 1.5 h
    assert budget_position(org.acme, at(6)) is None  # no budget
    assert budget_position(org.alpha, at(6) + timedelta(days=40)) is None  # March: none


def test_spend_counts_an_hour_once_however_often_metering_runs(org: Org) -> None:
    rates(org)
    budget(org.alpha, "40")
    hold(job_for(org), make_node(), 4, 5, [1000])
    meter_usage(now=at(7))
    meter_usage(now=at(7))
    position = budget_position(org.alpha, at(6))
    assert position is not None and position.spent == Decimal("4.00")
