"""Rating: usage intervals x rate versions -> statement lines. Pure: no Django, no I/O, no clock.

The contract:
- A usage interval is what one allocation held over [start, end): a GPU share in milli-GPU
  (250 = a quarter of a device), CPU in millicores, memory in MiB.
- Intervals are cut at every hour boundary and every rate boundary (UTC month boundaries are
  hour boundaries), and each piece is priced by the version in force at its start. Quantities
  stay exact integers (milli-GPU-seconds, millicore-seconds, MiB-seconds) until the end.
- Rates per cluster (issue 38): a usage's cluster is priced by that cluster's versions of its
  flavor where they are in force, and by the default versions (cluster "") elsewhere
  (`chain_for`). A line carries its usage's cluster ("" for records of before clusters).
- Pieces with the same account, flavor, cluster, resource, kind and unit price add up to one
  line.
  The unit price is the version's price x the priority class's multiplier x (1 - the
  borrowed discount, for borrowed capacity).
- Rounding, once per line and never per piece or per second: amount = unit price x exact
  quantity, rounded to the cent half-to-even (banker's rounding). Half-even is unbiased: over
  the thousands of lines a statement rolls up, ties round up as often as down, so a total of
  rounded lines does not drift one way. The quantity a line shows is rounded to 6 places for
  reading only; the amount is computed from the exact quantity.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from fractions import Fraction
from functools import lru_cache
from itertools import pairwise

HOUR = timedelta(hours=1)
QUANTITY_PLACES = Decimal("0.000001")
# resource -> (unit, how many integer units of the exact quantity make one unit)
UNITS: dict[str, tuple[str, int]] = {
    "gpu": ("GPU-hour", 1000 * 3600),  # milli-GPU-seconds
    "cpu": ("core-hour", 1000 * 3600),  # millicore-seconds
    "memory": ("GiB-hour", 1024 * 3600),  # MiB-seconds
}


class MissingRate(LookupError):
    """No rate version of `flavor` covers the instant `at`."""

    def __init__(self, flavor: str, at: datetime) -> None:
        super().__init__(f"no rate card of flavor {flavor!r} covers {at:%Y-%m-%dT%H:%M:%SZ}")
        self.flavor = flavor
        self.at = at


@dataclass(frozen=True)
class Rate:
    """One version of a flavor's prices, in force on [valid_from, valid_to)."""

    flavor: str
    valid_from: datetime
    valid_to: datetime | None
    gpu_hour: Decimal
    cpu_core_hour: Decimal = Decimal(0)
    memory_gib_hour: Decimal = Decimal(0)
    borrowed_discount: Decimal = Decimal(0)
    multipliers: Mapping[str, Decimal] = field(default_factory=dict)
    # The cluster these prices are for, by name; "": the default, for every other cluster.
    cluster: str = ""

    def covers(self, at: datetime) -> bool:
        return self.valid_from <= at and (self.valid_to is None or at < self.valid_to)

    def unit_price(self, resource: str, priority_class: str, borrowed: bool) -> Decimal:
        base = {"gpu": self.gpu_hour, "cpu": self.cpu_core_hour, "memory": self.memory_gib_hour}
        price = base[resource] * self.multipliers.get(priority_class, Decimal(1))
        if borrowed:
            price *= 1 - self.borrowed_discount
        return price


@dataclass(frozen=True)
class Usage:
    """What one allocation (or one account's share of something) held over [start, end)."""

    account: Hashable
    flavor: str
    kind: str
    start: datetime
    end: datetime
    gpu_milli: int
    cpu_milli: int = 0
    memory_mib: int = 0
    priority_class: str = ""
    borrowed: bool = False
    cluster: str = ""


@dataclass(frozen=True)
class Line:
    account: Hashable
    flavor: str
    resource: str
    kind: str
    unit: str
    rate: Decimal
    exact: Fraction  # in units (GPU-hours, core-hours, GiB-hours)
    amount: Decimal
    cluster: str = ""

    @property
    def quantity(self) -> Decimal:
        return quantity(self.exact)


def quantity(value: Fraction) -> Decimal:
    """An exact quantity as statements, exports and pages show it: six decimal places."""
    return (Decimal(value.numerator) / Decimal(value.denominator)).quantize(QUANTITY_PLACES)


def round_cents(value: Fraction) -> Decimal:
    """`value` to the cent, half-to-even, exactly."""
    return Decimal(half_even(value.numerator * 100, value.denominator)).scaleb(-2)


def cut_points(start: datetime, end: datetime, rates: Sequence[Rate]) -> list[datetime]:
    """Start, every hour boundary and rate boundary strictly inside, end: sorted."""
    points = {start, end}
    hour = start.astimezone(UTC).replace(minute=0, second=0, microsecond=0) + HOUR
    while hour < end:
        points.add(hour)
        hour += HOUR
    for rate in rates:
        for edge in (rate.valid_from, rate.valid_to):
            if edge is not None and start < edge < end:
                points.add(edge)
    return sorted(points)


def chain_for(rates: Sequence[Rate], flavor: str, cluster: str) -> list[Rate]:
    """The versions that price `flavor` on `cluster`, sorted: the cluster's own where they
    are in force, the default versions (cluster "") cut to the time outside them.

    A cluster's chain is unbroken (billing.rates.cards), so its versions in `rates` cover
    one span [first start, last end); before and after it the default versions apply, cut at
    its edges. A cluster without versions of its own is priced by the default chain whole."""
    default = sorted((r for r in rates if r.flavor == flavor and not r.cluster), key=_valid_from)
    if not cluster:
        return default
    own = sorted((r for r in rates if r.flavor == flavor and r.cluster == cluster), key=_valid_from)
    if not own:
        return default
    first, last = own[0].valid_from, own[-1].valid_to
    before = [replace(r, valid_to=_earlier(r.valid_to, first)) for r in default]
    after = (
        [] if last is None else [replace(r, valid_from=max(r.valid_from, last)) for r in default]
    )
    return sorted(
        [r for r in before if r.valid_from < first]
        + own
        + [r for r in after if r.valid_to is None or r.valid_to > r.valid_from],
        key=_valid_from,
    )


def in_force(rates: Sequence[Rate], flavor: str, cluster: str, at: datetime) -> Rate | None:
    """The version that prices `flavor` on `cluster` at `at`, as `chain_for` chooses: the
    cluster's own version covering `at`, else the default one; the very objects of `rates`
    (callers key caches by them)."""
    own = next(
        (r for r in rates if r.flavor == flavor and r.cluster == cluster and r.covers(at)), None
    )
    if own is not None and cluster:
        return own
    return next((r for r in rates if r.flavor == flavor and not r.cluster and r.covers(at)), None)


def _earlier(moment: datetime | None, bound: datetime) -> datetime:
    return bound if moment is None else min(moment, bound)


def pieces(usage: Usage, rates: Sequence[Rate]) -> Iterator[tuple[Usage, Rate]]:
    """`usage` cut at hours and rate boundaries, each piece with the version in force."""
    own = chain_for(rates, usage.flavor, usage.cluster)
    points = cut_points(usage.start, usage.end, own)
    for start, end in pairwise(points):
        rate = next((r for r in own if r.covers(start)), None)
        if rate is None:
            raise MissingRate(usage.flavor, start)
        yield replace(usage, start=start, end=end), rate


def held(usage: Usage) -> dict[str, Fraction]:
    """The exact quantity of each resource: amount held x seconds held (to the microsecond,
    as the database keeps times), in milli-GPU-, millicore- and MiB-seconds."""
    seconds = Fraction((usage.end - usage.start) // timedelta(microseconds=1), 1_000_000)
    return {
        "gpu": usage.gpu_milli * seconds,
        "cpu": usage.cpu_milli * seconds,
        "memory": usage.memory_mib * seconds,
    }


# (account, flavor, resource, kind, unit price, cluster)
LineKey = tuple[Hashable, str, str, str, Decimal, str]
MICROSECOND = timedelta(microseconds=1)
RESOURCES = ("gpu", "cpu", "memory")


def spans(usage: Usage, rates: Sequence[Rate]) -> Iterator[tuple[datetime, datetime, Rate]]:
    """`usage`'s interval cut at the rate boundaries only, each part with its version.

    The same prices as `pieces`: an hour boundary inside one version's span changes no
    price, and the parts' exact quantities add up to the pieces' (integers of microseconds),
    so the lines are identical; a usage of several hours is priced in one step instead of
    one per hour. MissingRate names the first instant no version covers."""
    return spans_of(usage, chain_for(rates, usage.flavor, usage.cluster))


def spans_of(usage: Usage, chain: list[Rate]) -> Iterator[tuple[datetime, datetime, Rate]]:
    """`spans` over the chain of `usage`'s flavor and cluster (`chain_for`), made already."""
    start, end = usage.start, usage.end
    for rate in chain:
        if start >= end:
            return
        if rate.valid_to is not None and rate.valid_to <= start:
            continue
        if rate.valid_from > start:
            raise MissingRate(usage.flavor, start)
        upto = end if rate.valid_to is None else min(end, rate.valid_to)
        yield start, upto, rate
        start = upto
    if start < end:
        raise MissingRate(usage.flavor, start)


def _valid_from(rate: Rate) -> datetime:
    return rate.valid_from


def rate_usage(usages: Iterable[Usage], rates: Sequence[Rate]) -> list[Line]:
    """Statement lines for `usages` priced by `rates`; MissingRate when a piece has none.
    Lines come in the order their first piece came: the same input, the same statement.

    Quantities add up as integers (amount held x microseconds) and become exact fractions
    once per line; unit prices are computed once per (version, resource, class, borrowed)."""
    totals: dict[LineKey, int] = {}
    prices: dict[tuple[int, str, str, bool], Decimal] = {}
    # One chain per (flavor, cluster), kept for the call: `prices` is keyed by the id of a
    # version, which a chain made anew per usage would not keep stable.
    chains: dict[tuple[str, str], list[Rate]] = {}
    for usage in usages:
        if usage.end <= usage.start:
            continue
        held_per = (usage.gpu_milli, usage.cpu_milli, usage.memory_mib)
        chain = chains.get((usage.flavor, usage.cluster))
        if chain is None:
            chain = chains[(usage.flavor, usage.cluster)] = chain_for(
                rates, usage.flavor, usage.cluster
            )
        for start, end, rate in spans_of(usage, chain):
            micros = (end - start) // MICROSECOND
            for resource, amount in zip(RESOURCES, held_per, strict=True):
                if not amount or not micros:
                    continue
                cached = (id(rate), resource, usage.priority_class, usage.borrowed)
                price = prices.get(cached)
                if price is None:
                    price = rate.unit_price(resource, usage.priority_class, usage.borrowed)
                    prices[cached] = price
                key = (usage.account, usage.flavor, resource, usage.kind, price, usage.cluster)
                totals[key] = totals.get(key, 0) + amount * micros
    return [make_line(key, Fraction(amount, 1_000_000)) for key, amount in totals.items()]


def make_line(key: LineKey, held_units: Fraction) -> Line:
    """One line from its key and exact quantity (in integer units: milli-GPU-seconds...)."""
    account, flavor, resource, kind, price, cluster = key
    unit, per_unit = UNITS[resource]
    exact = held_units / per_unit
    numerator, denominator = price_ratio(price)
    cents = half_even(numerator * exact.numerator * 100, denominator * exact.denominator)
    amount = Decimal(cents).scaleb(-2)
    return Line(account, flavor, resource, kind, unit, price, exact, amount, cluster)


@lru_cache(maxsize=4096)
def price_ratio(price: Decimal) -> tuple[int, int]:
    """A price as an exact integer ratio (a Decimal is finite: exact)."""
    return price.as_integer_ratio()


def half_even(numerator: int, denominator: int) -> int:
    """numerator / denominator (denominator > 0) rounded to an integer half-to-even, exactly:
    as `round` rounds a Fraction, without making one."""
    floor, remainder = divmod(numerator, denominator)
    twice = 2 * remainder
    if twice > denominator or (twice == denominator and floor % 2):
        return floor + 1
    return floor
