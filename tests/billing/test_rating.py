"""billing.rates.rating: usage intervals x rate versions -> lines, with the arithmetic worked
out."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from decimal import Decimal
from fractions import Fraction

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from billing.rates.rating import (
    MissingRate,
    Rate,
    Usage,
    cut_points,
    pieces,
    rate_usage,
    round_cents,
)

T0 = datetime(2031, 1, 31, 22, 0, tzinfo=UTC)  # two hours before a month ends
H = timedelta(hours=1)


def at(hours: float) -> datetime:
    return T0 + timedelta(hours=hours)


def rate(price: str, start: float = -1000, end: float | None = None, **kw: object) -> Rate:
    return Rate(
        flavor="H100",
        valid_from=at(start),
        valid_to=at(end) if end is not None else None,
        gpu_hour=Decimal(price),
        **kw,  # type: ignore[arg-type]
    )


def use(start: float, end: float, milli: int = 1000, **kw: object) -> Usage:
    return Usage(  # type: ignore[arg-type]
        account=kw.pop("account", "alice"),
        flavor="H100",
        kind=kw.pop("kind", "used"),
        start=at(start),
        end=at(end),
        gpu_milli=milli,
        **kw,
    )


def amounts(lines: list) -> list[tuple[str, str, Decimal, Decimal]]:  # type: ignore[type-arg]
    return sorted((ln.resource, ln.kind, ln.rate, ln.amount) for ln in lines)


@pytest.mark.parametrize(
    ("usages", "rates", "expected"),
    [
        # 250 milli for one hour at 2.00/GPU-hour: 0.25 GPU-hour x 2.00 = 0.50.
        ([use(0, 1, 250)], [rate("2.00")], [("gpu", "used", Decimal("2.00"), Decimal("0.50"))]),
        # A whole device for 90 minutes across an hour boundary, one line:
        # 1.5 GPU-hours x 3.00 = 4.50.
        ([use(0.5, 2, 1000)], [rate("3")], [("gpu", "used", Decimal("3"), Decimal("4.50"))]),
        # A rate change at 01:00 splits the interval: 1 h x 2.00 + 0.5 h x 4.00 = 2.00 + 2.00.
        (
            [use(0, 1.5)],
            [rate("2", end=1), rate("4", start=1)],
            [
                ("gpu", "used", Decimal("2"), Decimal("2.00")),
                ("gpu", "used", Decimal("4"), Decimal("2.00")),
            ],
        ),
        # Rounding once per line, not per second: three 1-second pieces of one device at
        # 9.00/GPU-hour cost 9.00 / 3600 = 0.0025 each. Rounded per second that is 0.00 three
        # times; rounded once per line it is 3 x 0.0025 = 0.0075 -> 0.01.
        (
            [use(0, 1 / 3600), use(1, 1 + 1 / 3600), use(2, 2 + 1 / 3600)],
            [rate("9.00")],
            [("gpu", "used", Decimal("9.00"), Decimal("0.01"))],
        ),
        # Half-to-even on a tie: 0.125 h x 0.20 = 0.025 -> 0.02 (2 is even), and
        # 0.375 h x 0.20 = 0.075 -> 0.08 (8 is even).
        ([use(0, 0.125)], [rate("0.20")], [("gpu", "used", Decimal("0.20"), Decimal("0.02"))]),
        ([use(0, 0.375)], [rate("0.20")], [("gpu", "used", Decimal("0.20"), Decimal("0.08"))]),
        # Priority multiplier and borrowed discount: 2.00 x 1.5 (critical) x (1 - 0.25) = 2.25
        # per GPU-hour, for 2 GPUs over one hour: 2 x 2.25 = 4.50.
        (
            [use(0, 1, 2000, priority_class="critical", borrowed=True)],
            [
                rate(
                    "2.00",
                    multipliers={"critical": Decimal("1.5")},
                    borrowed_discount=Decimal("0.25"),
                )
            ],
            [("gpu", "used", Decimal("2.250000"), Decimal("4.50"))],
        ),
        # Preempted and failed attempts are their own lines, at the same price:
        # 1 h x 1.00 used, 0.5 h x 1.00 preempted, 0.25 h x 1.00 failed.
        (
            [use(0, 1), use(1, 1.5, kind="preempted"), use(2, 2.25, kind="failed")],
            [rate("1.00")],
            [
                ("gpu", "failed", Decimal("1.00"), Decimal("0.25")),
                ("gpu", "preempted", Decimal("1.00"), Decimal("0.50")),
                ("gpu", "used", Decimal("1.00"), Decimal("1.00")),
            ],
        ),
    ],
    ids=[
        "quarter-gpu-hour",
        "across-an-hour",
        "rate-change-mid-interval",
        "round-per-line-not-per-second",
        "half-even-down",
        "half-even-up",
        "multiplier-and-discount",
        "preempted-and-failed-lines",
    ],
)
def test_rating_table(usages: list[Usage], rates: list[Rate], expected: list) -> None:  # type: ignore[type-arg]
    assert amounts(rate_usage(usages, rates)) == sorted(expected)


def test_cpu_and_memory_are_priced_per_core_hour_and_gib_hour() -> None:
    # 8 000 millicores = 8 cores x 0.5 h = 4 core-hours x 0.05 = 0.20;
    # 65 536 MiB = 64 GiB x 0.5 h = 32 GiB-hours x 0.01 = 0.32.
    card = rate("2", cpu_core_hour=Decimal("0.05"), memory_gib_hour=Decimal("0.01"))
    lines = rate_usage([use(0, 0.5, 0, cpu_milli=8000, memory_mib=65536)], [card])
    got = {ln.resource: (ln.unit, ln.quantity, ln.amount) for ln in lines}
    assert got == {
        "cpu": ("core-hour", Decimal("4.000000"), Decimal("0.20")),
        "memory": ("GiB-hour", Decimal("32.000000"), Decimal("0.32")),
    }


def test_intervals_are_cut_at_hours_month_ends_and_rate_boundaries() -> None:
    change = rate("1", start=1.25)
    points = cut_points(at(0.5), at(3), [change])
    # 22:30, 23:00, 23:15 (rate), 00:00 (February begins), 01:00 = at(3)
    assert points == [at(0.5), at(1), at(1.25), at(2), at(3)]
    assert at(2) == datetime(2031, 2, 1, tzinfo=UTC)


def test_a_piece_without_a_rate_is_refused_naming_the_flavor_and_instant() -> None:
    with pytest.raises(MissingRate, match=r"H100.*2031-01-31T23:00:00Z"):
        list(pieces(use(0, 2), [rate("1", end=1)]))


def test_round_cents_is_half_to_even_and_exact() -> None:
    assert [round_cents(Fraction(n, 1000)) for n in (5, 15, 25, 35, 1)] == [
        Decimal("0.00"),
        Decimal("0.02"),
        Decimal("0.02"),
        Decimal("0.04"),
        Decimal("0.00"),
    ]


# --- properties ---------------------------------------------------------------------------

seconds = st.integers(min_value=0, max_value=3 * 24 * 3600)


@st.composite
def scenario(draw: st.DrawFn) -> tuple[list[Usage], list[Rate], list[datetime]]:
    starts = sorted(set(draw(st.lists(seconds, min_size=0, max_size=4))))
    edges = [-(10**7), *starts]
    prices = draw(st.lists(st.integers(1, 900), min_size=len(edges), max_size=len(edges)))
    rates = [
        Rate(
            "H100",
            T0 + timedelta(seconds=lo),
            T0 + timedelta(seconds=hi) if hi is not None else None,
            Decimal(p) / 100,
        )
        for lo, hi, p in zip(edges, [*edges[1:], None], prices, strict=True)
    ]
    usages = []
    for a, b, milli in draw(
        st.lists(st.tuples(seconds, seconds, st.integers(1, 8000)), min_size=1, max_size=6)
    ):
        lo, hi = sorted((a, b))
        usages.append(
            Usage(
                "acct",
                "H100",
                "used",
                T0 + timedelta(seconds=lo),
                T0 + timedelta(seconds=hi),
                milli,
            )
        )
    bounds = sorted({T0 + timedelta(seconds=s) for s in draw(st.lists(seconds, max_size=5))})
    return usages, rates, bounds


def clip(usage: Usage, lo: datetime, hi: datetime) -> Usage | None:
    start, end = max(usage.start, lo), min(usage.end, hi)
    return (
        Usage(usage.account, usage.flavor, usage.kind, start, end, usage.gpu_milli)
        if end > start
        else None
    )


@settings(max_examples=150, deadline=None)
@given(scenario())
def test_every_gpu_second_is_metered_once_across_periods_and_rate_changes(
    case: tuple[list[Usage], list[Rate], list[datetime]],
) -> None:
    usages, rates, bounds = case
    held = sum(Fraction(u.gpu_milli) * int((u.end - u.start).total_seconds()) for u in usages)
    # Statement periods at random boundaries, each rated on its own.
    periods = list(zip([T0 - H, *bounds], [*bounds, T0 + timedelta(days=4)], strict=True))
    per_period = [
        rate_usage([c for u in usages if (c := clip(u, lo, hi))], rates) for lo, hi in periods
    ]
    metered = sum(ln.exact * 1000 * 3600 for lines in per_period for ln in lines)
    assert metered == held
    # The exact cost does not depend on where the periods fall; only rounding per line does,
    # by at most half a cent a line.
    whole = rate_usage(usages, rates)
    exact = sum(Fraction(ln.rate) * ln.exact for ln in whole)
    split = sum(Fraction(ln.rate) * ln.exact for lines in per_period for ln in lines)
    assert exact == split
    n_lines = sum(len(lines) for lines in per_period)
    rounded = sum(ln.amount for lines in per_period for ln in lines)
    assert abs(Fraction(rounded) - exact) <= Fraction(n_lines, 200)
