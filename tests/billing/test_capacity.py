"""billing.metering.capacity: one flavor's hour split into used, unavailable, idle reserved and
unreserved idle; and apportioning a rounded total. Properties over random clusters."""

from __future__ import annotations

import random
from decimal import Decimal
from fractions import Fraction

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from billing.metering.capacity import (
    DEVICE_HOUR,
    Holder,
    HolderSum,
    apportion,
    split_hour,
    split_sums,
    split_totals,
)

pytestmark = pytest.mark.backend_independent(
    "pure capacity arithmetic (import-linter): no database, cache or broker"
)


def test_a_childs_idle_guarantee_borrowed_by_its_sibling_is_not_idle() -> None:
    # Parent 2 GPUs = child a 1 + child b 1. a used nothing; b used 2 whole GPUs (borrowing
    # a's). Unused: a 1, b 0, parent max(0, 2 - 2) = 0, so nothing is idle reserved, though
    # one device (of 3) sat idle: it is unreserved idle.
    hour = DEVICE_HOUR
    split = split_hour(
        available={1, 2, 3},
        unavailable=set(),
        used_by_device={1: Fraction(hour), 2: Fraction(hour)},
        holders=[
            Holder(10, None, 2000, Fraction(2 * hour)),
            Holder(11, 10, 1000, Fraction(0)),
            Holder(12, 10, 1000, Fraction(2 * hour)),
        ],
    )
    assert split.idle_reserved == {}
    assert split.unreserved == hour


@st.composite
def clusters(draw: st.DrawFn) -> dict[str, object]:
    devices = draw(st.integers(1, 8))
    down = set(draw(st.lists(st.integers(0, devices - 1), max_size=devices)))
    used = {
        d: Fraction(draw(st.integers(0, 1000))) * draw(st.integers(0, 3600))
        for d in range(devices)
        if draw(st.booleans())
    }
    g_root = draw(st.integers(0, 8000))
    g_a = draw(st.integers(0, g_root))
    g_b = draw(st.integers(0, g_root - g_a))
    u_a = Fraction(draw(st.integers(0, 8 * DEVICE_HOUR)))
    u_b = Fraction(draw(st.integers(0, 8 * DEVICE_HOUR)))
    holders = [Holder(1, None, g_root, u_a + u_b), Holder(2, 1, g_a, u_a), Holder(3, 1, g_b, u_b)]
    return {
        "available": set(range(devices)) - down,
        "unavailable": down,
        "used_by_device": used,
        "holders": holders,
    }


@settings(max_examples=200, deadline=None)
@given(clusters())
def test_every_device_second_is_in_exactly_one_part(case: dict) -> None:  # type: ignore[type-arg]
    split = split_hour(**case)  # type: ignore[arg-type]
    parts = split.used + split.unavailable + split.idle_reserved_total + split.unreserved
    assert (
        parts
        == split.capacity
        == DEVICE_HOUR
        * len(
            case["available"] | case["unavailable"] | set(case["used_by_device"])  # type: ignore[operator]
        )
    )
    assert all(v > 0 for v in split.idle_reserved.values())
    assert split.unreserved >= 0
    root = case["holders"][0]  # type: ignore[index]
    assert split.idle_reserved_total <= max(0, root.guaranteed_milli * 3600 - root.used)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.fractions(min_value=0, max_value=10**6), min_size=1, max_size=6))
def test_apportioned_parts_add_up_to_the_rounded_total(parts: list[Fraction]) -> None:
    total, rounded = apportion(parts)
    assert sum(rounded, Decimal(0)) == total
    assert abs(Fraction(total) - sum(parts, Fraction(0))) <= Fraction(1, 200)
    assert all(abs(Fraction(r) - p) < Fraction(1, 100) for r, p in zip(rounded, parts, strict=True))


@pytest.mark.parametrize("seed", range(20))
def test_split_sums_in_integers_equal_split_totals_in_fractions(seed: int) -> None:
    """The hour splits of the cost reads are made in integers (`split_sums`); each must be
    the fractions' split (`split_totals`) exactly: nested holders, borrowing, idle short of
    the guarantees, a holder that used more than its guarantee."""
    rng = random.Random(seed)
    scale = 1_000_000
    devices = rng.randint(1, 16)
    capacity = DEVICE_HOUR * devices * scale
    used = rng.randint(0, capacity)
    down = rng.randint(0, capacity - used)
    tenants = list(range(1, rng.randint(1, 6) + 1))
    parents = {t: rng.choice([None, *[p for p in tenants if p < t]]) for t in tenants}
    guaranteed = {t: rng.randint(0, 4000) for t in tenants}
    held = {t: rng.randint(0, 5000 * 3600 * scale) for t in tenants}
    summed = split_sums(
        capacity=capacity,
        used=used,
        down=down,
        holders=[HolderSum(t, parents[t], guaranteed[t], held[t]) for t in tenants],
        seconds=3600,
        scale=scale,
    )
    fractions = split_totals(
        capacity=Fraction(capacity, scale),
        used=Fraction(used, scale),
        down=Fraction(down, scale),
        holders=[Holder(t, parents[t], guaranteed[t], Fraction(held[t], scale)) for t in tenants],
        seconds=3600,
    )
    assert summed == fractions
