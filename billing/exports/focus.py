"""The FOCUS export: cost lines as rows of the FinOps Open Cost and Usage Specification 1.0.

One row per cost line (a statement line's part per job type and priority class), per billing
month: a window is cut at the month boundaries (UTC) and each part rated as the month's
statement rates it, so that `BillingPeriodStart`/`End` are the month of the row, the
`ChargePeriodStart`/`End` the part of the window in that month, and the rows' `BilledCost` of
a month add up to its statement (FOCUS: a billing period's billed cost is its invoice's).

Prices (docs/billing.md "The FOCUS columns"): the list unit price is the rate card's price
of the resource, without the priority class's multiplier or the borrowed discount;
`ListCost` is that price x the exact quantity, rounded to the cent half-to-even as lines
are; `BilledCost` what the line charged (0 for showback). Gantry has no negotiated prices
nor commitments: the contracted price is the list price, the effective cost the billed cost.
tests/billing/test_focus_conformance.py checks every mandatory column's rules.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from decimal import Decimal
from fractions import Fraction
from typing import Any

from django.conf import settings
from django.contrib.auth import get_user_model

from billing.costs.lines import CostLine
from billing.models import LineKind
from billing.periods import month_end, month_start
from billing.rates.rating import Rate, chain_for, round_cents
from billing.rates.rating import quantity as _quantity
from billing.statements.rollup import rates_between
from common.text import csv_safe
from tenants.models import Project, Tenant

VERSION = "1.0"
PROVIDER = "Gantry"
SERVICE = "Gantry GPU compute"
# Provider-defined tag keys carry this prefix, as FOCUS asks of them.
TAG_PREFIX = "gantry/"
# FOCUS's unit format: "<singular unit>-<plural time units>", its terms capitalised.
UNITS = {"gpu": "GPU-Hours", "cpu": "Core-Hours", "memory": "GiB-Hours"}
COLUMNS = (
    "BilledCost",
    "BillingAccountId",
    "BillingAccountName",
    "BillingCurrency",
    "BillingPeriodEnd",
    "BillingPeriodStart",
    "ChargeCategory",
    "ChargeClass",
    "ChargeDescription",
    "ChargeFrequency",
    "ChargePeriodEnd",
    "ChargePeriodStart",
    "ConsumedQuantity",
    "ConsumedUnit",
    "ContractedCost",
    "ContractedUnitPrice",
    "EffectiveCost",
    "InvoiceIssuerName",
    "ListCost",
    "ListUnitPrice",
    "PricingCategory",
    "PricingQuantity",
    "PricingUnit",
    "ProviderName",
    "PublisherName",
    "ResourceId",
    "ResourceName",
    "ResourceType",
    "ServiceCategory",
    "ServiceName",
    "SkuId",
    "SubAccountId",
    "SubAccountName",
    "Tags",
    "x_Kind",
    "x_ShowbackCost",
    "x_BilledUnitPrice",
    "x_ClusterName",
)


def utc(moment: datetime) -> str:
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def billing_months(start: datetime, end: datetime) -> list[tuple[datetime, datetime]]:
    """[start, end) cut at the UTC month boundaries inside it."""
    parts = []
    while start < end:
        upto = min(end, month_end(month_start(start)))
        parts.append((start, upto))
        start = upto
    return parts


@dataclass(frozen=True)
class Period:
    """Where rows of one billing month stand: the month, the window's part of it, and the
    rate versions in force in that part (for the list prices)."""

    start: datetime
    end: datetime
    rates: list[Rate]

    @classmethod
    def of(cls, start: datetime, end: datetime) -> Period:
        return cls(start, end, rates_between(start, end))

    def list_price(self, line: CostLine) -> Decimal:
        """The rate card's price of the line's resource in force when it was used: the
        version whose price, with the line's class multiplier and borrowed discount or
        without, is the line's unit price (versions of one flavor that changed prices and
        multipliers so that a class's price stayed the same are merged into one line: the
        latest is taken). A line priced by no version (a part closed without its class)
        counts its billed price as the list price."""
        # The line's cluster's versions where it has its own, the default ones elsewhere.
        chain = chain_for(self.rates, line.flavor, line.cluster)
        for rate in sorted(chain, key=lambda r: r.valid_from, reverse=True):
            prices = {
                rate.unit_price(line.resource, line.priority_class, borrowed)
                for borrowed in (False, True)
            }
            if line.kind in (LineKind.IDLE_RESERVED, LineKind.ALLOCATED_IDLE):
                prices = {rate.unit_price(line.resource, "", False)}
            if line.rate in prices:
                return rate.unit_price(line.resource, "", False)
        return line.rate


class Names:
    """Slugs and usernames of the ids cost lines carry, read once per export."""

    def __init__(self) -> None:
        self.tenants = dict(Tenant.objects.values_list("id", "slug"))
        self.projects = dict(Project.objects.values_list("id", "slug"))
        self.users = dict(get_user_model().objects.values_list("id", "username"))


def rows(
    months: list[tuple[datetime, datetime, list[CostLine]]],
) -> Iterator[list[Any]]:
    """One FOCUS row per cost line of each (start, end, lines) month part, in COLUMNS' order."""
    names = Names()
    currency = settings.GANTRY_BILLING_CURRENCY
    for start, end, lines in months:
        period = Period.of(start, end)
        for line in lines:
            row = focus_row(line, period, names, currency)
            yield [row[column] for column in COLUMNS]


def _money(value: Decimal) -> Decimal:
    return value.quantize(Decimal("0.01")) + 0  # + 0: no "-0.00"


def _price(value: Decimal) -> str:
    """A unit price in FOCUS's numeric format: plain digits, no exponent, no trailing zeros."""
    return format((value + 0).normalize(), "f")


def focus_row(line: CostLine, period: Period, names: Names, currency: str) -> dict[str, Any]:
    """A cost line as FOCUS columns (None: null, an empty CSV field)."""
    usage = line.kind != LineKind.ADJUSTMENT
    billed = _money(line.amount) if line.charged else Decimal("0.00")
    project = names.projects.get(line.project) if line.project is not None else None
    tenant = names.tenants.get(line.tenant, str(line.tenant))
    prices = _prices(line, period) if usage else {"ListCost": billed, "ContractedCost": billed}
    return {
        "BilledCost": billed,
        "BillingAccountId": str(line.organisation),
        "BillingAccountName": csv_safe(names.tenants.get(line.organisation, "")),
        "BillingCurrency": currency,
        "BillingPeriodEnd": utc(month_end(month_start(period.start))),
        "BillingPeriodStart": utc(month_start(period.start)),
        "ChargeCategory": "Usage" if usage else "Adjustment",
        # An adjustment corrects a statement closed (invoiced) already.
        "ChargeClass": None if usage else "Correction",
        "ChargeDescription": csv_safe(_description(line)),
        "ChargeFrequency": "Usage-Based" if usage else "One-Time",
        "ChargePeriodEnd": utc(period.end),
        "ChargePeriodStart": utc(period.start),
        "EffectiveCost": billed,
        "InvoiceIssuerName": PROVIDER,
        "PricingCategory": "Standard" if usage else None,
        "ProviderName": PROVIDER,
        "PublisherName": PROVIDER,
        "ResourceId": f"project/{line.project}" if project else f"tenant/{line.tenant}",
        "ResourceName": csv_safe(project or tenant),
        "ResourceType": "Project" if project else "Tenant",
        "ServiceCategory": "Compute",
        "ServiceName": SERVICE,
        "SkuId": csv_safe(f"{line.flavor}/{line.resource}") if usage else None,
        "SubAccountId": str(line.tenant),
        "SubAccountName": csv_safe(tenant),
        "Tags": csv_safe(json.dumps(_tags(line, names, tenant, project), sort_keys=True)),
        "x_Kind": line.kind,
        "x_ShowbackCost": Decimal("0.00") if line.charged else _money(line.amount),
        "x_BilledUnitPrice": _price(line.rate) if usage else None,
        # The cluster the usage ran on (issue 38). A custom column, not RegionId or
        # AvailabilityZone: a cluster is where Gantry ran the job, not a provider's region
        # or zone; several clusters may share a site, and one may span zones.
        "x_ClusterName": csv_safe(line.cluster) if line.cluster else None,
        "ConsumedQuantity": None,
        "ConsumedUnit": None,
        "ContractedUnitPrice": None,
        "ListUnitPrice": None,
        "PricingQuantity": None,
        "PricingUnit": None,
        **prices,
    }


def _prices(line: CostLine, period: Period) -> dict[str, Any]:
    """The quantities, units, list and contracted prices and costs of a usage line."""
    unit = UNITS[line.resource]
    quantity = _quantity(line.quantity)
    listed = period.list_price(line)
    list_cost = round_cents(Fraction(listed) * line.quantity) + 0
    return {
        "ConsumedQuantity": quantity,
        "ConsumedUnit": unit,
        "PricingQuantity": quantity,
        "PricingUnit": unit,
        "ListUnitPrice": _price(listed),
        "ListCost": list_cost,
        "ContractedUnitPrice": _price(listed),
        "ContractedCost": list_cost,
    }


def _description(line: CostLine) -> str:
    if line.kind == LineKind.ADJUSTMENT:
        return "adjustment of a closed statement"
    what = f"{UNITS[line.resource]} of {line.flavor}, {line.kind}"
    return what + ("" if line.charged else " (showback, not charged)")


def _tags(line: CostLine, names: Names, tenant: str, project: str | None) -> dict[str, str]:
    user = names.users.get(line.user) if line.user is not None else None
    tags = {
        "tenant": tenant,
        "project": project,
        "user": user,
        "job_type": line.job_type or None,
        "priority_class": line.priority_class or None,
        "kind": line.kind,
    }
    return {TAG_PREFIX + key: value for key, value in tags.items() if value}
