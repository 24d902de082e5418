"""billing.metering.located: where a holder's idle reserved share lies when there are several
clusters (issue 38). Table tests with the arithmetic worked out, and properties: the parts add
up to the whole exactly, whole milli-GPUs stay whole, each holder's total is kept."""

from __future__ import annotations

from fractions import Fraction

import pytest
from hypothesis import given
from hypothesis import strategies as st

from billing.metering.located import apportion_int, fit_idle, guarantee_by_cluster, locate_share

pytestmark = pytest.mark.backend_independent(
    "pure arithmetic (no Django): no database, cache or broker"
)


@pytest.mark.parametrize(
    ("total", "weights", "expected"),
    [
        # 1000 x 3/4 = 750, 1000 x 1/4 = 250: exact
        pytest.param(1000, {"home": 3, "site-b": 1}, {"home": 750, "site-b": 250}, id="exact"),
        # 1000 / 3 = 333.33 each: the one left goes to the first (equal remainders: in order)
        pytest.param(1000, {"a": 1, "b": 1, "c": 1}, {"a": 334, "b": 333, "c": 333}, id="thirds"),
        # 5 x 2/7 = 1.43 -> 1, 5 x 5/7 = 3.57 -> 3; one left: the larger remainder (b, .57)
        pytest.param(5, {"a": 2, "b": 5}, {"a": 1, "b": 4}, id="largest-remainder"),
        pytest.param(7, {"a": 0, "b": 2}, {"a": 0, "b": 7}, id="no-weight-nothing"),
    ],
)
def test_apportion_int_worked_out(total: int, weights: dict[str, int], expected: object) -> None:
    assert apportion_int(total, weights) == expected


@pytest.mark.parametrize("weights", [{}, {"a": 0}, {"a": -1, "b": 2}])
def test_apportion_int_refuses_weights_that_say_nothing(weights: dict[str, int]) -> None:
    with pytest.raises(ValueError, match="cannot apportion"):
        apportion_int(10, weights)


@given(
    total=st.integers(0, 10**9),
    weights=st.dictionaries(st.text(min_size=1, max_size=4), st.integers(0, 10**6), min_size=1),
)
def test_apportion_int_parts_are_whole_add_up_and_stay_within_one_of_their_share(
    total: int, weights: dict[str, int]
) -> None:
    if not sum(weights.values()):
        weights = {**weights, "x": 1}
    parts = apportion_int(total, weights)
    assert sum(parts.values()) == total
    whole = sum(weights.values())
    for key, part in parts.items():
        exact = Fraction(total * weights[key], whole)
        assert isinstance(part, int) and part >= 0
        assert exact - 1 < part < exact + 1
        if not weights[key]:
            assert part == 0


def test_a_pin_lies_on_its_cluster_and_the_floating_rest_follows_the_available_devices() -> None:
    # Global guarantee 2000 milli, 1000 of it pinned to site-b: floating 1000, over 2 + 2
    # available devices: 500 + 500. On home 500, on site-b 1000 + 500.
    guarantee = guarantee_by_cluster(
        pins={"site-b": 1000}, floating=1000, devices={"home": 2, "site-b": 2}
    )
    assert guarantee == {"home": 500, "site-b": 1500}
    # An idle share of 2 GPU-hours (7,200,000 milli-GPU-seconds): a quarter on home.
    share = Fraction(2 * 3600 * 1000)
    assert locate_share(share, guarantee) == {
        "home": Fraction(1800 * 1000),
        "site-b": Fraction(5400 * 1000),
    }


@given(
    pins=st.dictionaries(st.sampled_from(["a", "b", "c", "d"]), st.integers(0, 64000)),
    floating=st.integers(0, 64000),
    devices=st.dictionaries(st.sampled_from(["a", "b", "c", "d"]), st.integers(0, 512)),
    share=st.fractions(min_value=0, max_value=64 * 3600 * 1000),
)
def test_located_guarantee_and_share_add_up_to_their_wholes_exactly(
    pins: dict[str, int], floating: int, devices: dict[str, int], share: Fraction
) -> None:
    if not sum(devices.values()):
        devices = {**devices, "a": 1}
    guarantee = guarantee_by_cluster(pins=pins, floating=floating, devices=devices)
    assert sum(guarantee.values()) == sum(pins.values()) + floating
    assert all(isinstance(milli, int) and milli > 0 for milli in guarantee.values())
    for cluster, milli in pins.items():  # a pin is never moved off its cluster
        assert guarantee.get(cluster, 0) >= milli
    if guarantee:
        parts = locate_share(share, guarantee)
        assert sum(parts.values(), Fraction(0)) == share
        assert set(parts) <= set(guarantee)


def test_a_cluster_holds_no_more_idle_reserved_than_it_had_idle() -> None:
    # site-b had 1 idle GPU-hour but 1.5 located (tenant 1: 1.25, tenant 2: 0.25): a third
    # of each moves to home, which has room. Tenant 1 keeps 1.25 x 2/3 = 5/6 on site-b and
    # 1.25 / 3 = 5/12 more on home; tenant 2 keeps 1/6 and moves 1/12.
    h = Fraction(3600 * 1000)
    fitted = fit_idle(
        {"home": {1: h * 3 / 4, 2: h * 3 / 4}, "site-b": {1: h * 5 / 4, 2: h / 4}},
        {"home": 3 * h, "site-b": h},
    )
    assert fitted == {
        "home": {1: h * 3 / 4 + h * 5 / 12, 2: h * 3 / 4 + h / 12},
        "site-b": {1: h * 5 / 6, 2: h / 6},
    }


@st.composite
def located_within_idle(
    draw: st.DrawFn,
) -> tuple[dict[str, dict[int, Fraction]], dict[str, Fraction]]:
    clusters = draw(st.lists(st.sampled_from("abcde"), min_size=1, max_size=5, unique=True))
    idle = {c: Fraction(draw(st.integers(0, 8 * 3600 * 1000))) for c in clusters}
    budget = sum(idle.values(), Fraction(0))
    located: dict[str, dict[int, Fraction]] = {}
    for cluster in clusters:
        for tenant in draw(st.lists(st.integers(1, 6), max_size=4, unique=True)):
            share = Fraction(draw(st.integers(0, 10**6)), draw(st.integers(1, 10**3)))
            share = min(share, budget)
            budget -= share
            if share:
                located.setdefault(cluster, {})[tenant] = share
    return located, idle


@given(located_within_idle())
def test_fitting_keeps_each_holders_total_and_no_cluster_exceeds_its_idle(
    case: tuple[dict[str, dict[int, Fraction]], dict[str, Fraction]],
) -> None:
    located, idle = case
    fitted = fit_idle(located, idle)

    def totals(split: dict[str, dict[int, Fraction]]) -> dict[int, Fraction]:
        out: dict[int, Fraction] = {}
        for shares in split.values():
            for tenant, share in shares.items():
                out[tenant] = out.get(tenant, Fraction(0)) + share
        return {t: v for t, v in out.items() if v}

    assert totals(fitted) == totals(located)
    for cluster, shares in fitted.items():
        assert all(share >= 0 for share in shares.values())
        assert sum(shares.values(), Fraction(0)) <= idle.get(cluster, Fraction(0))
        if sum(located.get(cluster, {}).values(), Fraction(0)) <= idle.get(cluster, 0):
            # a cluster within its idle loses nothing
            for tenant, share in located.get(cluster, {}).items():
                assert shares.get(tenant, Fraction(0)) >= share
