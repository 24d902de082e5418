"""Where a flavor's capacity went in one metered hour. Pure: no Django, no I/O.

Quantities are milli-GPU-seconds (a device present for the hour is 1000 x 3600). Each device's
capacity splits into exactly one of:
- used: the shares allocations held on it (every kind: used, preempted, failed);
- unavailable: the rest of a device that was cordoned, on a node not ready, or unhealthy;
- idle: the rest of an available device. Idle splits again into idle reserved (the part of
  the tenants' guarantees that nothing used, up to what was idle) and unreserved idle.
So used + unavailable + idle reserved + unreserved idle = capacity, exactly.

Idle reserved is attributed to the tenants that hold the guarantees. A holder's unused
guarantee is max(0, guarantee - what its subtree used); its own claim is that minus its
holding children's unused guarantees (a parent's guarantee contains its children's). The
cluster's idle reserved, min(idle, the top holders' unused guarantees), is shared among the
holders in proportion to their own claims. Where a child's idle guarantee was borrowed by its
sibling, the parent's unused guarantee is smaller than the child's, and the cluster's idle
reserved shrinks accordingly: nobody pays for guarantee that someone else used.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from decimal import Decimal
from fractions import Fraction
from math import lcm

from billing.rates.rating import half_even

DEVICE_HOUR = 1000 * 3600


@dataclass(frozen=True)
class Holder:
    """A tenant holding a guarantee of the flavor, and its nearest ancestor that holds one."""

    tenant: int
    parent: int | None
    guaranteed_milli: int
    used: Fraction  # milli-GPU-seconds its whole subtree held in the hour


@dataclass(frozen=True)
class HourSplit:
    capacity: Fraction
    used: Fraction
    unavailable: Fraction
    idle_reserved: Mapping[int, Fraction]  # holder tenant -> its share
    unreserved: Fraction

    @property
    def idle_reserved_total(self) -> Fraction:
        return sum(self.idle_reserved.values(), Fraction(0))


def split_hour(
    *,
    available: set[int],
    unavailable: set[int],
    used_by_device: Mapping[int, Fraction],
    holders: Sequence[Holder],
    seconds: int = 3600,
) -> HourSplit:
    """The split of one flavor's hour. A device used but in neither set counts as available
    (it was present: something ran on it)."""
    per_device = Fraction(1000 * seconds)
    devices = available | unavailable | set(used_by_device)
    used = sum(used_by_device.values(), Fraction(0))
    down = sum(
        (per_device - used_by_device.get(d, Fraction(0)) for d in unavailable - available),
        Fraction(0),
    )
    return split_totals(
        capacity=per_device * len(devices), used=used, down=down, holders=holders, seconds=seconds
    )


def split_totals(
    *, capacity: Fraction, used: Fraction, down: Fraction, holders: Sequence[Holder], seconds: int
) -> HourSplit:
    """The split of one flavor's hour from its totals: the capacity of the devices present,
    what allocations used and what was unavailable (`split_hour` adds them up per device;
    billing/metering/splits.py has the database add them up)."""
    idle = capacity - used - down
    shares = _idle_reserved(idle, holders, seconds)
    reserved = sum(shares.values(), Fraction(0))
    return HourSplit(capacity, used, down, shares, idle - reserved)


@dataclass(frozen=True)
class HolderSum:
    """A Holder whose subtree's use is an integer in 1/scale milli-GPU-seconds (`split_sums`)."""

    tenant: int
    parent: int | None
    guaranteed_milli: int
    used: int


def split_sums(
    *, capacity: int, used: int, down: int, holders: Sequence[HolderSum], seconds: int, scale: int
) -> HourSplit:
    """`split_totals` for integer quantities in 1/scale milli-GPU-seconds (the database's
    sums of milli x microseconds: scale 10**6). The same split, exactly: the arithmetic stays
    in integers up to each holder's share, the one division that needs a fraction, since
    the split of every metered hour is made on each read of costs."""
    idle = capacity - used - down
    unused = {h.tenant: max(0, h.guaranteed_milli * seconds * scale - h.used) for h in holders}
    children_unused: dict[int, int] = {}
    for h in holders:
        if h.parent is not None:
            children_unused[h.parent] = children_unused.get(h.parent, 0) + unused[h.tenant]
    claims = {
        h.tenant: max(0, unused[h.tenant] - children_unused.get(h.tenant, 0)) for h in holders
    }
    top = sum(unused[h.tenant] for h in holders if h.parent is None)
    total_claims = sum(claims.values())
    reserved = min(max(idle, 0), top)
    shares: dict[int, Fraction] = {}
    if reserved and total_claims:
        shares = {t: Fraction(reserved * c, total_claims * scale) for t, c in claims.items() if c}
    # The shares add up to `reserved` exactly (their claims add up to the total).
    reserved_total = Fraction(reserved, scale) if shares else Fraction(0)
    return HourSplit(
        Fraction(capacity, scale),
        Fraction(used, scale),
        Fraction(down, scale),
        shares,
        Fraction(idle, scale) - reserved_total,
    )


def _idle_reserved(idle: Fraction, holders: Sequence[Holder], seconds: int) -> dict[int, Fraction]:
    unused = {h.tenant: max(Fraction(0), h.guaranteed_milli * seconds - h.used) for h in holders}
    children_unused: dict[int, Fraction] = {}
    for h in holders:
        if h.parent is not None:
            children_unused[h.parent] = (
                children_unused.get(h.parent, Fraction(0)) + unused[h.tenant]
            )
    claims = {
        h.tenant: max(Fraction(0), unused[h.tenant] - children_unused.get(h.tenant, Fraction(0)))
        for h in holders
    }
    top = sum((unused[h.tenant] for h in holders if h.parent is None), Fraction(0))
    total_claims = sum(claims.values(), Fraction(0))
    reserved = min(max(idle, Fraction(0)), top)
    if not reserved or not total_claims:
        return {}
    return {t: reserved * c / total_claims for t, c in claims.items() if c}


def apportion(parts: Sequence[Fraction]) -> tuple[Decimal, list[Decimal]]:
    """Round a total once (half-to-even, to the cent) and split it into parts that add up to
    it exactly: each part is its exact value rounded down to the cent, and the cents left go
    to the parts with the largest remainders (the largest remainder method)."""
    common = lcm(*(p.denominator for p in parts)) if parts else 1
    return apportion_over([p.numerator * (common // p.denominator) for p in parts], common)


def apportion_over(numerators: Sequence[int], denominator: int) -> tuple[Decimal, list[Decimal]]:
    """`apportion` of parts given as integers over one positive denominator (amounts in
    currency units): integer arithmetic only, for callers whose parts share a denominator."""
    cents = [n * 100 for n in numerators]
    total = half_even(sum(cents), denominator)
    floors = [c // denominator for c in cents]
    order = sorted(range(len(cents)), key=lambda i: (-(cents[i] % denominator), i))
    for i in order[: total - sum(floors)]:
        floors[i] += 1
    return Decimal(total).scaleb(-2), [Decimal(f).scaleb(-2) for f in floors]
