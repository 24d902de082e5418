"""`gantry capacity` against a live server: finance's pools, a department admin's subtree,
a member's 403 said plainly."""

from __future__ import annotations

import json
from typing import Any

import pytest

from cli.capacity import plan_rows
from tests.capacity.builders import stored_run
from tests.conftest import Org

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def stored(org: Org) -> None:
    """A capacity run stored for the organisation, as the refresh leaves one."""
    stored_run(org)


def test_finance_sees_each_pool_its_forecast_and_the_day_it_is_full(gantry: Any) -> None:
    code, out, err = gantry("carol", "capacity")
    assert code == 0, err
    header, row = out.splitlines()[:2]
    assert header.split()[:4] == ["POOL", "SUBTREE", "GPUS", "TODAY"]
    assert "H100-80GB" in row and "(whole pool)" in row and "2026-12-16" in row
    assert "team-alpha" in row  # the first driver


def test_a_department_admin_sees_their_subtree_only(gantry: Any) -> None:
    code, out, err = gantry("dana", "--json", "capacity")
    assert code == 0, err
    plans = json.loads(out)
    assert [p["subtree"] for p in plans] == ["research"]
    assert "team-charlie" not in out


def test_a_member_is_told_who_capacity_planning_is_for(gantry: Any) -> None:
    code, _, err = gantry("alice", "capacity")
    assert code == 1
    assert "403" in err and "platform admins, finance and tenant admins" in err


def test_rows_show_the_band_a_week_at_a_time() -> None:
    # p50 of 10 a day with a band of 8-12: the week ending on day 30 reads "10 (8-12)".
    series = {"requested": [5.0] * 14, "p10": [8.0] * 200, "p50": [10.0] * 200, "p90": [12.0] * 200}
    plan = {
        "flavor": "H100-80GB",
        "subtree": None,
        "capacity_gpus": 8,
        "series": series,
        "saturation": {"p50_day": None, "p90_day": "2027-01-01"},
        "drivers": [],
    }
    [row] = plan_rows([plan])
    assert row["today"] == "5" and row["in_30d"] == "10 (8-12)"
    assert row["full_p50"] == "not in sight" and row["full_p90"] == "2027-01-01"
