"""The FOCUS export against the FOCUS 1.0 specification's rules, column by column.

Each mandatory column of FOCUS 1.0 (and each conditional one Gantry fills) is checked for
presence, type and format, nullability and allowed values, and the relations between columns
(the list and contracted costs are their unit price x the pricing quantity, the charge period
lies in the billing period, which is a calendar month in UTC, a billing period's billed cost
is its invoice's...), on an export of two billing months that holds every kind of line: GPU,
CPU and memory, a priority class's multiplier, the borrowed discount, a preempted attempt,
idle reserved capacity and allocated-but-idle time as showback, a closed statement with an
adjustment.
Specification: github.com/FinOps-Open-Cost-and-Usage-Spec/FOCUS_Spec, tag v1.0,
specification/columns/ and specification/attributes/.
"""

from __future__ import annotations

import csv
import io
import json
import re
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from decimal import Decimal
from fractions import Fraction
from typing import Any

import pytest

from billing.metering.hourly import meter_usage
from billing.models import BillingPolicy, Statement
from billing.rates.cards import RatePrices, rate_card_add
from billing.statements.closing import statement_adjust, statement_close
from billing.statements.rollup import roll_up
from scheduler.models import JobEvent, JobState
from scheduler.telemetry.rollups import LAG, rollup_run
from tenants.models import Quota
from tests import factories as f
from tests.billing.builders import T0, at, hold, job_for, make_node
from tests.billing.test_idle_usage import feed
from tests.billing.test_statements import GUARANTEES
from tests.conftest import Org

WINDOW = {"from": "2031-01-31T20:00:00Z", "to": "2031-02-01T02:00:00Z"}  # [T0, at(6))
JANUARY = ("2031-01-01T00:00:00Z", "2031-02-01T00:00:00Z")
FEBRUARY = ("2031-02-01T00:00:00Z", "2031-03-01T00:00:00Z")

Row = dict[str, str | None]

# --- the rules ------------------------------------------------------------------------------

DECIMAL = re.compile(r"^-?(0|[1-9]\d*)(\.\d+)?(E-?\d+)?$")  # Numeric Format: no +, no commas
DATETIME = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ$")  # Date/Time Format, UTC
CURRENCY = re.compile(r"^[A-Z]{3}$")  # ISO 4217
UNIT = re.compile(r"^[A-Z][A-Za-z]*-(Years|Months|Days|Hours|Minutes|Seconds)$")  # Unit Format

CHARGE_CATEGORIES = {"Usage", "Purchase", "Tax", "Credit", "Adjustment"}
CHARGE_FREQUENCIES = {"One-Time", "Recurring", "Usage-Based"}
PRICING_CATEGORIES = {"Standard", "Dynamic", "Committed", "Other"}
SERVICE_CATEGORIES = {
    "AI and Machine Learning",
    "Analytics",
    "Business Applications",
    "Compute",
    "Databases",
    "Developer Tools",
    "Multicloud",
    "Identity",
    "Integration",
    "Internet of Things",
    "Management and Governance",
    "Media",
    "Migration",
    "Mobile",
    "Networking",
    "Security",
    "Storage",
    "Web",
    "Other",
}


@dataclass(frozen=True)
class Column:
    """A column's content constraints: may it be null, and what a value must look like."""

    nullable: bool
    check: Callable[[str], bool]


def decimal(value: str) -> bool:
    return bool(DECIMAL.match(value)) and not re.match(r"^-0(\.0*)?$", value)


def text(value: str) -> bool:
    return value != ""


def one_of(allowed: set[str]) -> Callable[[str], bool]:
    return lambda value: value in allowed


def key_value(value: str) -> bool:
    """Key-Value Format: a JSON object of unique keys whose values are scalars; Gantry's
    keys are provider-defined, so prefixed."""
    pairs = json.loads(value, object_pairs_hook=list)
    keys = [key for key, _ in pairs]
    return (
        isinstance(pairs, list)
        and len(keys) == len(set(keys))
        and all(not isinstance(v, dict | list) for _, v in pairs)
        and all(key.startswith("gantry/") for key in keys)
    )


# Mandatory columns, then the conditional ones Gantry fills (it has resources, sub accounts,
# SKUs, tags, usage measured and published list prices; no commitments, regions, zones or
# negotiated prices, so no columns of those).
COLUMNS: dict[str, Column] = {
    "BilledCost": Column(False, decimal),
    "BillingAccountId": Column(False, text),
    "BillingAccountName": Column(True, text),
    "BillingCurrency": Column(False, lambda v: bool(CURRENCY.match(v))),
    "BillingPeriodEnd": Column(False, lambda v: bool(DATETIME.match(v))),
    "BillingPeriodStart": Column(False, lambda v: bool(DATETIME.match(v))),
    "ChargeCategory": Column(False, one_of(CHARGE_CATEGORIES)),
    "ChargeClass": Column(True, one_of({"Correction"})),
    "ChargeDescription": Column(True, text),
    "ChargeFrequency": Column(False, one_of(CHARGE_FREQUENCIES)),
    "ChargePeriodEnd": Column(False, lambda v: bool(DATETIME.match(v))),
    "ChargePeriodStart": Column(False, lambda v: bool(DATETIME.match(v))),
    "ConsumedQuantity": Column(True, decimal),
    "ConsumedUnit": Column(True, lambda v: bool(UNIT.match(v))),
    "ContractedCost": Column(False, decimal),
    "ContractedUnitPrice": Column(True, lambda v: decimal(v) and Decimal(v) >= 0),
    "EffectiveCost": Column(False, decimal),
    "InvoiceIssuerName": Column(False, text),
    "ListCost": Column(False, decimal),
    "ListUnitPrice": Column(True, lambda v: decimal(v) and Decimal(v) >= 0),
    "PricingCategory": Column(True, one_of(PRICING_CATEGORIES)),
    "PricingQuantity": Column(True, decimal),
    "PricingUnit": Column(True, lambda v: bool(UNIT.match(v))),
    "ProviderName": Column(False, text),
    "PublisherName": Column(False, text),
    "ResourceId": Column(True, text),
    "ResourceName": Column(True, text),
    "ResourceType": Column(True, text),
    "ServiceCategory": Column(False, one_of(SERVICE_CATEGORIES)),
    "ServiceName": Column(False, text),
    "SkuId": Column(True, text),
    "SubAccountId": Column(True, text),
    "SubAccountName": Column(True, text),
    "Tags": Column(True, key_value),
}
# Null unless a correction, for usage and purchases (PricingQuantity, PricingUnit,
# ListUnitPrice, ContractedUnitPrice, SkuId, PricingCategory: "MUST NOT be null when
# ChargeClass is not Correction and ChargeCategory is Usage or Purchase").
NOT_NULL_FOR_USAGE = [
    "PricingQuantity",
    "PricingUnit",
    "ListUnitPrice",
    "ContractedUnitPrice",
    "SkuId",
    "PricingCategory",
]


def violations(header: list[str], rows: list[Row]) -> list[str]:
    """Every rule of FOCUS 1.0 a dataset breaks, said; [] when it conforms."""
    out = [f"missing column {name}" for name in COLUMNS if name not in header]
    custom = [i for i, name in enumerate(header) if name not in COLUMNS]
    out += [f"custom column {header[i]} without x_" for i in custom if header[i][:2] != "x_"]
    if custom and min(custom) < max(i for i, n in enumerate(header) if n in COLUMNS):
        out.append("custom columns before FOCUS columns")
    for number, row in enumerate(rows, start=1):
        out += [f"row {number}: {problem}" for problem in row_violations(row)]
    out += period_violations(rows)
    return out


def row_violations(row: Row) -> list[str]:
    out = []
    for name, rule in COLUMNS.items():
        value = row.get(name)
        if value is None:
            if not rule.nullable:
                out.append(f"{name} is null")
        elif not rule.check(value):
            out.append(f"{name} {value!r} is not allowed")
    if out:
        return out
    return out + relation_violations(row)


def _near(product: Decimal, cost: Decimal, price: Decimal) -> bool:
    """Unit price x pricing quantity (6 places) = the cost (to the cent): half a cent of
    the cost's rounding and the quantity's, half a millionth x the price."""
    return abs(product - cost) <= Decimal("0.005") + price * Decimal("0.0000005")


def relation_violations(row: Row) -> list[str]:
    out = []
    category, correction = row["ChargeCategory"], row["ChargeClass"] == "Correction"
    usage_like = category in ("Usage", "Purchase") and not correction
    for name in NOT_NULL_FOR_USAGE:
        if usage_like and row[name] is None:
            out.append(f"{name} is null on a {category} row")
        if category == "Tax" and row[name] is not None:
            out.append(f"{name} is set on a Tax row")
    consumed = [row["ConsumedQuantity"], row["ConsumedUnit"]]
    if category == "Usage" and not correction and None in consumed:
        out.append("ConsumedQuantity/ConsumedUnit null on a Usage row")
    if category != "Usage" and consumed != [None, None]:
        out.append(f"ConsumedQuantity/ConsumedUnit set on a {category} row")
    if category == "Purchase" and row["ChargeFrequency"] == "Usage-Based":
        out.append("a Purchase is Usage-Based")
    billed = Decimal(row["BilledCost"] or 0)
    for price, cost in [("ListUnitPrice", "ListCost"), ("ContractedUnitPrice", "ContractedCost")]:
        value = Decimal(row[cost] or 0)
        if row[price] is not None and not correction:
            unit = Decimal(row[price] or 0)
            if not _near(unit * Decimal(row["PricingQuantity"] or 0), value, unit):
                out.append(f"{price} x PricingQuantity != {cost} ({value})")
        if row[price] is None and category != "Tax" and value != billed:
            out.append(f"{cost} != BilledCost with no {price}")
    if category not in ("Usage", "Purchase") and Decimal(row["EffectiveCost"] or 0) != billed:
        out.append("EffectiveCost != BilledCost on a charge unrelated to others")
    if (row["ResourceId"] is None) != (row["ResourceType"] is None):
        out.append("ResourceType null where ResourceId is not, or the reverse")
    if row["ResourceId"] is not None and row["ResourceName"] == row["ResourceId"]:
        out.append("ResourceName repeats ResourceId")
    if (row["SubAccountId"] is None) != (row["SubAccountName"] is None):
        out.append("SubAccountName null where SubAccountId is not, or the reverse")
    return out + time_violations(row)


def _instant(value: str | None) -> datetime:
    return datetime.fromisoformat(str(value).replace("Z", "+00:00"))


def time_violations(row: Row) -> list[str]:
    """The billing period is a month in UTC, the charge period inside it."""
    bill_start, bill_end = _instant(row["BillingPeriodStart"]), _instant(row["BillingPeriodEnd"])
    start, end = _instant(row["ChargePeriodStart"]), _instant(row["ChargePeriodEnd"])
    out = []
    first = bill_start.replace(day=1, hour=0, minute=0, second=0)
    following = (first + timedelta(days=32)).replace(day=1)
    if (bill_start, bill_end) != (first, following):
        out.append(f"billing period {bill_start}..{bill_end} is not a calendar month")
    if not bill_start <= start < end <= bill_end:
        out.append(f"charge period {start}..{end} outside the billing period")
    return out


def period_violations(rows: list[Row]) -> list[str]:
    """One name per billing account; its name unique among them."""
    names: dict[str | None, set[str | None]] = defaultdict(set)
    for row in rows:
        names[row["BillingAccountId"]].add(row["BillingAccountName"])
    out = [f"account {a} has names {n}" for a, n in names.items() if len(n) != 1]
    shown = [next(iter(n)) for n in names.values()]
    if len(shown) != len(set(shown)):
        out.append("two billing accounts share a name")
    return out


# --- the month ------------------------------------------------------------------------------


def every_kind(org: Org) -> None:
    """Hours 0-5 from T0 (January's last four, February's first two), metered; January's
    hours closed and adjusted.

    H100: 2.00 a GPU-hour, then 2.50 from hour 2; 0.10 a core-hour, 0.01 a GiB-hour, `high`
    x1.2, borrowed capacity 25 % off. Idle reserved capacity is showback, and so is the half
    hour alice's GPU idled (allocated but idle)."""
    pat = org.users["pat"]
    for slug, gpus in {**GUARANTEES, "acme": 4}.items():
        Quota.objects.filter(tenant__slug=slug, flavor=org.h100).update(
            guaranteed_milli=gpus * 1000, limit_milli=64000
        )
    BillingPolicy.objects.create(organisation=org.acme, idle_policy="showback")
    for since, gpu in [(T0 - timedelta(days=30), "2.00"), (at(2), "2.50")]:
        prices = RatePrices(
            Decimal(gpu),
            cpu_core_hour=Decimal("0.10"),
            memory_gib_hour=Decimal("0.01"),
            borrowed_discount=Decimal("0.25"),
            multipliers={f.priority("high"): Decimal("1.2")},
        )
        rate_card_add(user=pat, flavor=org.h100, valid_from=since, prices=prices)
    n1 = make_node("n1", gpus=4)
    alice = job_for(org, cpu_milli=4000, memory_mib=16384)
    hold(alice, n1, 0, 6, [1000])  # 1 GPU, 4 cores, 16 GiB, hours 0-5
    bob = job_for(org, "bob-bravo", project=org.proj_bravo, priority_class=f.priority("high"))
    hold(bob, n1, 0, 1, [1000], first_device=1)  # 1 GPU-hour at x1.2, preempted
    preempted = JobEvent.objects.create(
        job=bob, kind="state", from_state=JobState.RUNNING, to_state=JobState.PREEMPTED
    )
    JobEvent.objects.filter(pk=preempted.pk).update(at=at(1))
    chris = job_for(
        org, "chris", project=org.proj_charlie, priority_class=f.priority("best-effort")
    )
    hold(chris, n1, 4, 5, [1000], first_device=2)  # borrowed, February's first hour
    feed(alice, 0, 30, 2.0)  # alice's GPU idle for hour 0's first 30 minutes: showback
    while rollup_run(now=at(6) + LAG):
        pass
    assert meter_usage(now=at(7)) == 6
    statement = statement_close(user=pat, organisation=org.acme, start=T0, end=at(4), now=at(7))
    statement_adjust(
        user=pat, statement=statement, tenant=org.charlie, amount=Decimal("-2.00"), reason="node"
    )


def focus_export(client: Any) -> tuple[list[str], list[Row]]:
    response = client.get("/api/v1/costs/export/", {**WINDOW, "format": "focus"})
    assert response.status_code == 200, response.content[:500]
    data = b"".join(response.streaming_content).decode("utf-8")
    header, *cells = list(csv.reader(io.StringIO(data)))
    return header, [{k: v or None for k, v in zip(header, r, strict=True)} for r in cells]


@pytest.fixture
def exported(org: Org, client_for: Any) -> tuple[list[str], list[Row]]:
    every_kind(org)
    return focus_export(client_for("carol"))


# --- the tests ------------------------------------------------------------------------------


def test_the_export_breaks_no_rule_of_focus_1_0(exported: tuple[list[str], list[Row]]) -> None:
    header, rows = exported
    assert violations(header, rows) == []


def test_the_month_has_every_kind_of_line(exported: tuple[list[str], list[Row]]) -> None:
    _, rows = exported
    seen = {(r["x_Kind"], r["PricingUnit"], r["BilledCost"] == "0.00") for r in rows}
    assert {
        ("used", "GPU-Hours", False),
        ("used", "Core-Hours", False),
        ("used", "GiB-Hours", False),
        ("preempted", "GPU-Hours", False),
        ("idle-reserved", "GPU-Hours", True),  # showback
        ("allocated-idle", "GPU-Hours", True),
        ("adjustment", None, False),
    } <= seen
    tags = [json.loads(r["Tags"] or "{}") for r in rows]
    assert {t.get("gantry/priority_class") for t in tags} >= {"normal", "high", "best-effort"}
    assert {(r["BillingPeriodStart"], r["BillingPeriodEnd"]) for r in rows} == {JANUARY, FEBRUARY}


def test_each_billing_month_bills_its_invoice(
    org: Org, client_for: Any, exported: tuple[list[str], list[Row]]
) -> None:
    """FOCUS: a billing period's BilledCost adds up to its invoice: January's closed
    statement (adjustment included), February's open hours as the cost API rates them."""
    _, rows = exported
    billed: dict[tuple[str | None, str | None], Decimal] = defaultdict(Decimal)
    for row in rows:
        billed[(row["BillingPeriodStart"], row["BillingPeriodEnd"])] += Decimal(
            row["BilledCost"] or 0
        )
    statement = Statement.objects.get(organisation=org.acme)
    january = roll_up(statement.lines.values_list("tenant_id", "amount", "charged"))
    assert billed[JANUARY] == january[org.acme.pk].charged
    response = client_for("carol").get(
        "/api/v1/costs/", {"from": "2031-02-01T00:00:00Z", "to": WINDOW["to"]}
    )
    assert billed[FEBRUARY] == Decimal(response.json()["total"]["charged"])
    charge_periods = {
        (r["ChargePeriodStart"], r["ChargePeriodEnd"], r["BillingPeriodStart"]) for r in rows
    }
    assert charge_periods == {
        (WINDOW["from"], JANUARY[1], JANUARY[0]),
        (FEBRUARY[0], WINDOW["to"], FEBRUARY[0]),
    }


def _one(rows: list[Row], **match: str) -> Row:
    found = [r for r in rows if all(r[k] == v for k, v in match.items())]
    assert len(found) == 1, (match, found)
    return found[0]


def test_list_prices_leave_out_the_multiplier_and_the_discount(
    exported: tuple[list[str], list[Row]],
) -> None:
    _, rows = exported
    # bob's `high` hour: 1 GPU-hour x 2.00 x 1.2 = 2.40 billed; at list, 2.00.
    high = _one(rows, x_Kind="preempted", PricingUnit="GPU-Hours")
    assert (high["PricingQuantity"], high["ListUnitPrice"]) == ("1.000000", "2")
    assert (high["BilledCost"], high["EffectiveCost"], high["ListCost"]) == ("2.40", "2.40", "2.00")
    assert high["x_BilledUnitPrice"] == "2.4"
    # chris's borrowed hour in February: 1 GPU-hour x 2.50 x (1 - 0.25) = 1.875 -> 1.88
    # (half-even); at list, 2.50.
    borrowed = _one(
        rows, ChargePeriodStart=FEBRUARY[0], SubAccountName="team-charlie", x_Kind="used"
    )
    assert (borrowed["BilledCost"], borrowed["ListCost"]) == ("1.88", "2.50")
    assert borrowed["ListUnitPrice"] == borrowed["ContractedUnitPrice"] == "2.5"


def test_cpu_and_memory_rows_carry_their_quantities(
    exported: tuple[list[str], list[Row]],
) -> None:
    _, rows = exported
    # alice: 4 cores and 16 GiB for January's 4 hours (closed), February's 2 (open).
    expected = {
        ("Core-Hours", JANUARY[0]): ("16.000000", "1.60"),  # 16 x 0.10
        ("GiB-Hours", JANUARY[0]): ("64.000000", "0.64"),  # 64 x 0.01
        ("Core-Hours", FEBRUARY[0]): ("8.000000", "0.80"),
        ("GiB-Hours", FEBRUARY[0]): ("32.000000", "0.32"),
    }
    for (unit, month), (quantity, cost) in expected.items():
        row = _one(rows, PricingUnit=unit, BillingPeriodStart=month)
        assert (row["PricingQuantity"], row["ConsumedQuantity"]) == (quantity, quantity)
        assert row["BilledCost"] == row["ListCost"] == cost


def test_showback_and_adjustments(exported: tuple[list[str], list[Row]]) -> None:
    _, rows = exported
    for row in rows:
        if row["x_Kind"] in ("idle-reserved", "allocated-idle"):  # showback: billed nothing
            assert row["BilledCost"] == row["EffectiveCost"] == "0.00"
            assert Decimal(row["ListCost"] or 0) == Decimal(row["x_ShowbackCost"] or 0) > 0
    adjustment = _one(rows, x_Kind="adjustment")
    assert (adjustment["ChargeCategory"], adjustment["ChargeClass"]) == ("Adjustment", "Correction")
    assert adjustment["BilledCost"] == adjustment["ListCost"] == "-2.00"
    assert adjustment["PricingQuantity"] is adjustment["ListUnitPrice"] is None


@pytest.mark.parametrize(
    ("change", "broken"),
    [
        ({"ListCost": "9.99"}, "ListUnitPrice x PricingQuantity != ListCost"),
        ({"PricingQuantity": None}, "PricingQuantity is null on a Usage row"),
        ({"BillingPeriodStart": "2031-01-31T20:00:00Z"}, "not a calendar month"),
        ({"BilledCost": "+1.00"}, "BilledCost '+1.00' is not allowed"),
        ({"ChargeClass": "Refund"}, "ChargeClass 'Refund' is not allowed"),
        ({"PricingUnit": "GPU-hour"}, "PricingUnit 'GPU-hour' is not allowed"),
        ({"Tags": '{"kind": "used"}'}, "Tags"),
        ({"BillingCurrency": "eur"}, "BillingCurrency"),
    ],
    ids=["list-cost", "quantity", "period", "plus-sign", "class", "unit", "tag-prefix", "currency"],
)
def test_the_checker_catches_each_kind_of_breach(change: Row, broken: str) -> None:
    """The rules can fail: a conforming row, changed, breaks the rule named."""
    row: Row = {
        **dict.fromkeys(COLUMNS),
        "BilledCost": "2.40",
        "BillingAccountId": "1",
        "BillingAccountName": "acme",
        "BillingCurrency": "EUR",
        "BillingPeriodStart": JANUARY[0],
        "BillingPeriodEnd": JANUARY[1],
        "ChargeCategory": "Usage",
        "ChargeFrequency": "Usage-Based",
        "ChargePeriodStart": WINDOW["from"],
        "ChargePeriodEnd": JANUARY[1],
        "ConsumedQuantity": "1.000000",
        "ConsumedUnit": "GPU-Hours",
        "ContractedCost": "2.00",
        "ContractedUnitPrice": "2",
        "EffectiveCost": "2.40",
        "InvoiceIssuerName": "Gantry",
        "ListCost": "2.00",
        "ListUnitPrice": "2",
        "PricingCategory": "Standard",
        "PricingQuantity": "1.000000",
        "PricingUnit": "GPU-Hours",
        "ProviderName": "Gantry",
        "PublisherName": "Gantry",
        "ServiceCategory": "Compute",
        "ServiceName": "Gantry GPU compute",
        "SkuId": "H100-80GB/gpu",
        "Tags": '{"gantry/kind": "used"}',
    }
    assert row_violations(row) == []
    assert any(broken in problem for problem in row_violations({**row, **change}))


@pytest.mark.parametrize(
    ("kept", "resource", "expected"),
    [
        (["3/2"], "cpu", Fraction(3, 2)),  # kept with the part since quantities are
        ([], "gpu", Fraction(1, 4)),  # closed before: a GPU part's exact GPU-hours
        ([], "cpu", Fraction(12)),  # a CPU part: the line's 16 x its 3.00 of 4.00
    ],
    ids=["kept", "gpu-before", "cpu-before"],
)
def test_a_frozen_parts_quantity(kept: list[str], resource: str, expected: Fraction) -> None:
    from billing.costs.lines import _part_quantity

    got = _part_quantity(kept, resource, "1/4", Decimal("16"), "3.00", Decimal("4.00"))
    assert got == expected
