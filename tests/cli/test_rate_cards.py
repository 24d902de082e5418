"""`gantry rate-cards` against a live server (issue 38): each chain of versions per GPU model
and cluster with its effective dates; finance adds versions (a cluster's own card, a second
version that closes the first); a member reads but may not add; bad prices are said plainly;
prices are shown as money, in the currency's minor units (--json keeps the API's strings)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from billing.models import RateCard
from cli.money import money
from scheduler.models import Cluster

pytestmark = pytest.mark.django_db(transaction=True)

ADD = ("rate-cards", "add", "--flavor", "H100-80GB")


@pytest.fixture
def site_b(db: Any) -> Cluster:
    return Cluster.objects.create(name="site-b", backend="simulated")


def test_finance_adds_versions_and_everyone_reads_each_chain(gantry: Any, site_b: Cluster) -> None:
    for argv in (
        ["--from", "2031-01-01T00:00Z", "--gpu-hour", "2.00", "--multiplier", "high=1.5"],
        ["--cluster", "site-b", "--from", "2031-01-01T00:00Z", "--gpu-hour", "5.00"],
        ["--from", "2031-03-01T00:00Z", "--gpu-hour", "2.50", "--borrowed-discount", "0.3"],
    ):
        code, _, err = gantry("carol", *ADD, *argv)
        assert code == 0, err
    code, out, err = gantry("alice", "rate-cards")
    assert code == 0, err
    header, *lines = out.splitlines()
    assert header.split()[:6] == ["ID", "FLAVOR", "CLUSTER", "VERSION", "VALID_FROM", "VALID_TO"]
    # the default card's chain first: the second version closed the first where it starts
    assert [line.split()[1:6] for line in lines] == [
        ["H100-80GB", "default", "1", "2031-01-01T00:00:00Z", "2031-03-01T00:00:00Z"],
        ["H100-80GB", "default", "2", "2031-03-01T00:00:00Z", "(open)"],
        ["H100-80GB", "site-b", "1", "2031-01-01T00:00:00Z", "(open)"],
    ]
    assert "high=1.5" in lines[0]
    code, out, err = gantry("alice", "--json", "rate-cards", "--cluster", "site-b")
    assert code == 0, err
    [card] = json.loads(out)
    assert (card["cluster"], card["gpu_hour"], card["version"]) == ("site-b", "5.000000", 1)


@pytest.mark.parametrize(
    ("user", "argv", "code", "said"),
    [
        ("alice", ["--gpu-hour", "2.00"], 1, "HTTP 403"),
        ("carol", ["--gpu-hour", "two"], 1, 'gpu_hour: must be a decimal number such as "2.50"'),
        ("carol", ["--gpu-hour", "2", "--cluster", "nowhere"], 1, "cluster: no cluster named"),
        ("carol", ["--gpu-hour", "2", "--multiplier", "high"], 2, "write it as CLASS=FACTOR"),
    ],
    ids=["a-member", "not-a-price", "unknown-cluster", "bad-multiplier"],
)
def test_bad_versions_are_said_plainly_and_change_nothing(
    gantry: Any, user: str, argv: list[str], code: int, said: str
) -> None:
    answer, _, err = gantry(user, *ADD, "--from", "2031-01-01T00:00Z", *argv)
    assert answer == code and said in err, err
    assert not RateCard.objects.exists()


@pytest.mark.parametrize(
    ("amount", "currency", "shown"),
    [
        ("2.500000", "EUR", "2.50"),
        ("0.000000", "EUR", "0.00"),
        ("0.012500", "EUR", "0.0125"),  # places the price has are kept, never rounded away
        ("350.000000", "JPY", "350"),  # no minor unit
        ("1.500000", "KWD", "1.500"),  # thousandths
        ("12345678.000000", "usd", "12345678.00"),
        (None, "EUR", ""),
    ],
)
def test_a_price_is_shown_in_its_currencys_minor_units(
    amount: str | None, currency: str, shown: str
) -> None:
    assert money(amount, currency) == shown


def test_the_table_shows_prices_as_money_and_json_keeps_the_api_strings(gantry: Any) -> None:
    code, _, err = gantry(
        "carol", *ADD, "--from", "2031-01-01T00:00Z", "--gpu-hour", "2.5", "--cpu-core-hour",
        "0.0125",
    )  # fmt: skip
    assert code == 0, err
    code, out, err = gantry("alice", "rate-cards")
    assert code == 0, err
    header, line = out.splitlines()
    columns = header.split()
    cells = line.split()
    # "EUR 2.50" is two cells of the table's whitespace: the GPU-hour price follows its code
    at = columns.index("GPU_HOUR")
    assert cells[at : at + 4] == ["EUR", "2.50", "0.0125", "0.00"]
    assert "2.500000" not in out
    code, out, err = gantry("alice", "--json", "rate-cards")
    [card] = json.loads(out)
    assert (card["gpu_hour"], card["cpu_core_hour"]) == ("2.500000", "0.012500")
