"""Statements: an organisation's lines for a period, rolled up to every node of its tree.

A line belongs to an account: (tenant, project, user) for what jobs held, (tenant, -, -) for
idle reserved capacity charged to the tenant holding the guarantee. Lines are rounded once
each (billing/rates/rating.py); a node's total is the sum of the rounded lines of its subtree, so
the leaves add up to the root to the cent. A period is whole metered hours.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Hashable, Iterable, Iterator
from dataclasses import dataclass, replace
from datetime import datetime
from decimal import Decimal
from fractions import Fraction
from itertools import pairwise
from typing import Any

from django.db.models import BigIntegerField, Case, F, IntegerField, Min, Sum, Value, When
from django.db.models.functions import Cast

from billing.metering.attempts import ending_state, kind_of
from billing.metering.capacity import HourSplit, apportion_over
from billing.metering.splits import ClusterKey, cluster_splits
from billing.models import (
    BillingPolicy,
    IdlePolicy,
    LineKind,
    MeteringPeriod,
    RateCard,
    UsageRecord,
)
from billing.rates import rating
from billing.rates.cards import flavor_renames
from common.errors import DomainError
from tenants.models import Tenant

Account = tuple[int, int | None, int | None]  # tenant, project, user
Held = tuple[Account, str, Decimal, str]  # idle reserved: account, flavor, price, cluster
# (start, end) -> the hour splits of that window per flavor and cluster. The splits are the
# installation's, the same for every organisation: a caller rating several organisations
# over the same window passes one of these so that they are read and computed once.
SplitsMemo = dict[tuple[datetime, datetime], dict[ClusterKey, HourSplit]]


@dataclass(frozen=True)
class Part:
    """The share of a line that one job type and priority class carry."""

    job_type: str
    priority_class: str
    amount: Decimal
    gpu_hours: Fraction
    # Its exact quantity in the line's unit, whatever the resource (GPU-, core-, GiB-hours).
    quantity: Fraction = Fraction(0)


@dataclass(frozen=True)
class DraftLine:
    line: rating.Line
    charged: bool = True
    # Per job type and priority class, adding up to the line ("" and "" when the line is
    # nobody's job: idle reserved capacity).
    parts: tuple[Part, ...] = ()

    def frozen_split(self) -> list[list[str]]:
        """`parts` as StatementLine.split keeps them."""
        return [
            [p.job_type, p.priority_class, str(p.amount), str(p.gpu_hours), str(p.quantity)]
            for p in self.parts
        ]


def whole(line: rating.Line, charged: bool = True) -> DraftLine:
    """A line that is one part (no job type or class)."""
    gpu_hours = line.exact if line.resource == "gpu" else Fraction(0)
    return DraftLine(line, charged, (Part("", "", line.amount, gpu_hours, line.exact),))


def split_lines(detailed: list[rating.Line]) -> list[DraftLine]:
    """Lines rated per (tenant, project, user, job type, priority class) merged into the
    statement's lines per (tenant, project, user), each with its parts.

    The merged line is rated from the exact sum, as if rated whole. Its rounded amount is
    apportioned over the parts in proportion to their exact amounts by the largest remainder
    method (`capacity.apportion`), so the parts add up to the line to the cent."""
    groups: dict[rating.LineKey, list[rating.Line]] = defaultdict(list)
    for line in detailed:
        account = line.account[:3]  # type: ignore[index]
        groups[(account, line.flavor, line.resource, line.kind, line.rate, line.cluster)].append(
            line
        )
    out = []
    for key, parts in groups.items():
        merged, amounts = _merged(key, parts)
        out.append(
            DraftLine(
                merged,
                True,
                tuple(
                    Part(
                        part.account[3],  # type: ignore[index]
                        part.account[4],  # type: ignore[index]
                        amount,
                        part.exact if part.resource == "gpu" else Fraction(0),
                        part.exact,
                    )
                    for part, amount in zip(parts, amounts, strict=True)
                ),
            )
        )
    return out


def _merged(key: rating.LineKey, parts: list[rating.Line]) -> tuple[rating.Line, list[Decimal]]:
    """The line of `parts` (one key but the account's job type and class) and each part's
    share of its amount: `capacity.apportion_over` of the parts' exact amounts.

    Every part has the key's unit price and resource, so their exact quantities are
    integers over one denominator (UNITS: micro-units of the resource's integer unit), and so
    are their exact amounts: no fraction is made."""
    per_unit = rating.UNITS[key[2]][1]
    common = 1_000_000 * per_unit
    units = []
    for part in parts:
        scale, rest = divmod(common, part.exact.denominator)
        if rest:  # usage_lines' quantities are micro-units: cannot happen
            raise AssertionError(f"{part.exact} is not a whole number of micro-units")
        units.append(part.exact.numerator * scale)
    merged = rating.make_line(key, Fraction(sum(units), 1_000_000))
    numerator, denominator = rating.price_ratio(key[4])
    amount, amounts = apportion_over([numerator * u for u in units], denominator * common)
    if amount != merged.amount:  # the same exact sum rounded the same way: cannot differ
        raise AssertionError(f"apportioned {amount} != line {merged.amount}")
    return merged, amounts


def rates_between(start: datetime, end: datetime) -> list[rating.Rate]:
    """The versions in force in [start, end), under their flavor's name and under each of
    its former names (what was recorded before a rename is the flavor's: rates.flavor_renames);
    each with its cluster's name ("" for the default cards)."""
    cards = RateCard.objects.filter(valid_from__lt=end).exclude(valid_to__lte=start)
    former: dict[str, list[str]] = defaultdict(list)
    for old, new in flavor_renames().items():
        former[new].append(old)
    rates = [
        rating.Rate(
            card.flavor.name,
            card.valid_from,
            card.valid_to,
            card.gpu_hour,
            card.cpu_core_hour,
            card.memory_gib_hour,
            card.borrowed_discount,
            {m.priority_class.name: m.multiplier for m in card.multipliers.all()},
            card.cluster.name if card.cluster else "",
        )
        for card in cards.select_related("flavor", "cluster").prefetch_related(
            "multipliers__priority_class"
        )
    ]
    return rates + [replace(r, flavor=old) for r in rates for old in former.get(r.flavor, ())]


def price_at(
    rates: list[rating.Rate], flavor: str, hour: datetime, cluster: str = ""
) -> rating.Rate:
    """The version that prices `flavor` on `cluster` at `hour` (rating.chain_for: the
    cluster's own, else the default); "" the default card."""
    chain = rating.chain_for(rates, flavor, cluster)
    found = next((r for r in chain if r.covers(hour)), None)
    if found is None:
        raise rating.MissingRate(flavor, hour)
    return found


# Usage records are read this many metered hours at a time: what a statement holds in memory
# is its lines and one slice of records, however many jobs ran.
SLICE_HOURS = 24


def period_slices(start: datetime, end: datetime) -> Iterator[list[int]]:
    """The ids of the metered hours of [start, end), in slices of SLICE_HOURS, in order."""
    ids = list(
        MeteringPeriod.objects.filter(start__gte=start, start__lt=end)
        .order_by("start")
        .values_list("id", flat=True)
    )
    for index in range(0, len(ids), SLICE_HOURS):
        yield ids[index : index + SLICE_HOURS]


def rate_windows(
    start: datetime, end: datetime, rates: list[rating.Rate]
) -> list[tuple[datetime, datetime]]:
    """[start, end) cut at every rate boundary inside it: in each part, every flavor has one
    version in force (or none) throughout. Rates change on the hour, so each metered hour,
    and each usage record, falls in one part."""
    edges = {
        edge
        for rate in rates
        for edge in (rate.valid_from, rate.valid_to)
        if edge is not None and start < edge < end
    }
    return list(pairwise(sorted({start, end} | edges)))


# Orders a usage record by (period, allocation) in one integer, as the records were read
# before they were summed in SQL: lines keep the order of their first record.
_ORDER = 10**12


def _summed(
    organisation: Tenant, parts: list[tuple[datetime, datetime]]
) -> Iterator[tuple[Any, ...]]:
    """The organisation's usage records of the metered hours in `parts` (consecutive), summed
    in SQL per part (its index) and (tenant, project, user, job type, priority class, flavor,
    borrowed, how the attempt ended): integer quantities (amount held x microseconds), the
    first record's order and the earliest start. One query for all the parts."""
    big = BigIntegerField()
    part = Case(
        *(When(period__start__lt=hi, then=Value(i)) for i, (_, hi) in enumerate(parts[:-1])),
        default=Value(len(parts) - 1),
        output_field=IntegerField(),
    )
    return iter(
        UsageRecord.objects.filter(
            period__start__gte=parts[0][0],
            period__start__lt=parts[-1][1],
            tenant__path__startswith=organisation.path,
        )
        .annotate(ending=ending_state("allocation__job_id", "allocation__started_at"), part=part)
        .values_list(
            "part",
            "tenant_id",
            "project_id",
            "user_id",
            "job_type",
            "priority_class",
            "flavor",
            "borrowed",
            "ending",
            "cluster",
        )
        .annotate(
            gpu=Sum(F("gpu_milli") * F("micros"), output_field=big),
            cpu=Sum(F("cpu_milli") * F("micros"), output_field=big),
            memory=Sum(F("memory_mib") * F("micros"), output_field=big),
            # Both factors typed bigint: untyped, PostgreSQL returned the product wrapped.
            first=Min(
                Cast("period_id", big) * Value(_ORDER, output_field=big) + F("allocation_id"),
                output_field=big,
            ),
            since=Min("start"),
        )
        .order_by()
    )


def usage_lines(
    organisation: Tenant, start: datetime, end: datetime, *, detail: bool = False
) -> list[rating.Line]:
    """Used, preempted and failed lines of the organisation's jobs in [start, end).

    `detail`: accounts are (tenant, project, user, job type, priority class) instead, for the
    cost API's finer aggregations (billing/costs/lines.py); the pieces and prices are the same.

    The lines `rating.rate_usage` makes of the usage records, without reading them: the
    database sums their integer quantities per account, flavor, class, borrowing and kind in
    each part of the period with one version per flavor (`rate_windows`), and each sum is
    priced here at its version's unit price. Integer sums are exact, so each line's exact
    quantity, and its amount rounded once, are the same as rating the records one by one
    (tests/billing/test_summed_in_sql.py compares them)."""
    rates = rates_between(start, end)
    totals: dict[rating.LineKey, int] = {}
    firsts: dict[rating.LineKey, tuple[int, int]] = {}
    prices: dict[tuple[int, str, str, bool], Decimal] = {}
    parts = rate_windows(start, end, rates)
    if not parts:
        return []
    # (part, flavor, cluster) -> the version in force: the cluster's own, else the default.
    # The parts are cut at every version's edges, the clusters' too, so it is one per part.
    in_force: dict[tuple[int, str, str], rating.Rate | None] = {}
    chains: dict[tuple[str, str], list[rating.Rate]] = {}
    missing: tuple[datetime, str] | None = None
    renames = flavor_renames()
    for part, tenant, project, user, job_type, klass, flavor, borrowed, ending, *rest in _summed(
        organisation, parts
    ):
        cluster, gpu, cpu, memory, first, since = rest
        # Usage recorded under a former name is the flavor's: one line under its name now.
        flavor = renames.get(flavor, flavor)
        if (part, flavor, cluster) not in in_force:
            if (flavor, cluster) not in chains:
                chains[(flavor, cluster)] = rating.chain_for(rates, flavor, cluster)
            lo = parts[part][0]
            in_force[(part, flavor, cluster)] = next(
                (r for r in chains[(flavor, cluster)] if r.covers(lo)), None
            )
        rate = in_force[(part, flavor, cluster)]
        if rate is None:
            missing = min(missing or (since, flavor), (since, flavor))
            continue
        account = (tenant, project, user, job_type, klass) if detail else (tenant, project, user)
        kind = kind_of(ending)
        for index, (resource, held) in enumerate(
            zip(rating.RESOURCES, (gpu, cpu, memory), strict=True)
        ):
            if not held:
                continue
            cached = (id(rate), resource, klass, borrowed)
            price = prices.get(cached)
            if price is None:
                price = prices[cached] = rate.unit_price(resource, klass, borrowed)
            key = (account, flavor, resource, kind, price, cluster)
            totals[key] = totals.get(key, 0) + held
            firsts[key] = min(firsts.get(key, (first, index)), (first, index))
    if missing is not None:
        raise rating.MissingRate(missing[1], missing[0])
    return [
        rating.make_line(key, Fraction(totals[key], 1_000_000))
        for key in sorted(totals, key=firsts.__getitem__)
    ]


def idle_lines(
    organisation: Tenant,
    start: datetime,
    end: datetime,
    used: list[rating.Line],
    *,
    splits: SplitsMemo | None = None,
) -> list[DraftLine]:
    """Idle reserved capacity of the organisation's guarantee holders, per its policy: a
    line per cluster its shares are located on (billing/metering/located.py), priced at that
    cluster's card (its own, else the default). `splits`: the window's splits shared with
    other organisations' (SplitsMemo)."""
    rates = rates_between(start, end)
    paths = dict(
        Tenant.objects.filter(path__startswith=organisation.path).values_list("id", "path")
    )
    held: dict[Held, Fraction] = defaultdict(Fraction)
    if splits is None:
        splits = {}
    if (start, end) not in splits:
        splits[(start, end)] = cluster_splits(start, end)
    for (hour, flavor, cluster), split in sorted(splits[(start, end)].items()):
        for tenant_id, share in split.idle_reserved.items():
            if tenant_id in paths:
                price = price_at(rates, flavor, hour, cluster).gpu_hour
                held[((tenant_id, None, None), flavor, price, cluster)] += share
    policy = (
        BillingPolicy.objects.filter(organisation=organisation)
        .values_list("idle_policy", flat=True)
        .first()
    ) or IdlePolicy.CHARGE
    if policy == IdlePolicy.SPREAD:
        held = _spread(held, used)
    return [
        whole(
            rating.make_line(
                (account, flavor, "gpu", LineKind.IDLE_RESERVED, price, cluster), share
            ),
            charged=policy != IdlePolicy.SHOWBACK,
        )
        for (account, flavor, price, cluster), share in held.items()
    ]


def _spread(held: dict[Held, Fraction], used: list[rating.Line]) -> dict[Held, Fraction]:
    """Idle reserved capacity spread over the accounts that held GPUs in the period, in
    proportion to their GPU-hours; kept by the holders when nobody held any."""
    weights: dict[Hashable, Fraction] = defaultdict(Fraction)
    for line in used:
        if line.resource == "gpu":
            weights[line.account] += line.exact
    total = sum(weights.values(), Fraction(0))
    if not total:
        return held
    spread: dict[Held, Fraction] = defaultdict(Fraction)
    for (_, flavor, price, cluster), share in held.items():
        for account, weight in weights.items():
            spread[(account, flavor, price, cluster)] += share * weight / total  # type: ignore[index]
    return spread


def organisation_lines(
    organisation: Tenant, start: datetime, end: datetime, *, splits: SplitsMemo | None = None
) -> list[DraftLine]:
    """Every line of the organisation for [start, end): what its jobs held, its idle reserved
    capacity, and as showback what its jobs held while idle (billing/metering/idle.py).
    DomainError when a flavor used has no rate for an hour of the period. `splits`: see
    SplitsMemo."""
    # Imported here: it builds on this module's prices and lines.
    from billing.metering.idle import allocated_idle_lines

    try:
        used: list[DraftLine] = []
        idle: list[DraftLine] = []
        # No metered hour (a month to come): no usage and no split, so no line but these.
        if MeteringPeriod.objects.filter(start__gte=start, start__lt=end).exists():
            used = split_lines(usage_lines(organisation, start, end, detail=True))
            idle = idle_lines(organisation, start, end, [d.line for d in used], splits=splits)
        return (
            used
            + idle
            + [whole(d.line, d.charged) for d in allocated_idle_lines(organisation, start, end)]
        )
    except rating.MissingRate as missing:
        raise DomainError(f"{missing}: add a rate card for it first.") from None


@dataclass
class Totals:
    charged: Decimal = Decimal("0.00")
    showback: Decimal = Decimal("0.00")


def roll_up(lines: Iterable[tuple[int, Decimal, bool]]) -> dict[int, Totals]:
    """(tenant, amount, charged) lines -> the totals of every tenant over its subtree."""
    paths = dict(Tenant.objects.values_list("id", "path"))
    totals: dict[int, Totals] = defaultdict(Totals)
    for tenant_id, amount, charged in lines:
        for ancestor in (int(p) for p in paths[tenant_id].strip("/").split("/") if p):
            if charged:
                totals[ancestor].charged += amount
            else:
                totals[ancestor].showback += amount
    return dict(totals)
