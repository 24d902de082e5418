"""A job's cost range before it runs, with the arithmetic worked out."""

from __future__ import annotations

from datetime import timedelta
from decimal import Decimal

from billing.costs.projection import job_cost_estimate
from billing.rates.cards import RatePrices, rate_card_add
from tests import factories as f
from tests.billing.builders import T0, at
from tests.conftest import Org


def rates(org: Org) -> None:
    pat = org.users["pat"]
    start = T0 - timedelta(days=1)
    # H100: 4.00 a GPU-hour, 0.05 a core-hour, 0.01 a GiB-hour; "high" costs x1.5.
    rate_card_add(
        user=pat,
        flavor=org.h100,
        valid_from=start,
        prices=RatePrices(
            Decimal(4),
            Decimal("0.05"),
            Decimal("0.01"),
            multipliers={f.priority("high"): Decimal("1.5")},
        ),
    )
    rate_card_add(user=pat, flavor=org.a100, valid_from=start, prices=RatePrices(Decimal(2)))
    # From hour 10 the H100 costs 6.00: an estimate uses the rate in force when it is made.
    rate_card_add(user=pat, flavor=org.h100, valid_from=at(10), prices=RatePrices(Decimal(6)))


def job(org: Org, **kw: object) -> object:
    fields = {
        "replicas": 2,
        "gpu_milli_per_replica": 500,
        "cpu_milli": 4000,
        "memory_mib": 16384,
        "flavors": ["H100-80GB", "A100-40GB"],
        "max_runtime_s": 7200,
    }
    fields.update(kw)
    return f.JobFactory.build(project=org.proj_alpha, submitted_by=org.users["alice"], **fields)


def test_the_range_runs_from_the_cheapest_flavor_to_the_dearest_worked_out(org: Org) -> None:
    rates(org)
    estimate = job_cost_estimate(job(org), at=at(1))
    # H100 per hour: 1 GPU x 4.00 + 8 cores x 0.05 + 32 GiB x 0.01 = 4.72.
    # A100 per hour: 1 GPU x 2.00 (no CPU or memory price) = 2.00.
    assert estimate.per_hour_low == Decimal(2)
    assert estimate.per_hour_high == Decimal("4.72")
    assert (estimate.low, estimate.high) == (Decimal("4.00"), Decimal("9.44"))  # 2 hours
    assert [p.flavor for p in estimate.flavors] == ["A100-40GB", "H100-80GB"]
    assert estimate.cost_for(1800) == Decimal("2.36")  # half an hour at the dearest


def test_the_declared_runtime_bounds_the_low_end_and_the_maximum_the_high(org: Org) -> None:
    rates(org)
    spec = {"estimated_runtime_s": 1800}
    estimate = job_cost_estimate(job(org, spec=spec, flavors=["H100-80GB"]), at=at(1))
    assert (estimate.low, estimate.high) == (Decimal("2.36"), Decimal("9.44"))
    assert (estimate.low_runtime_s, estimate.high_runtime_s) == (1800, 7200)


def test_an_unbounded_runtime_has_no_high_end(org: Org) -> None:
    rates(org)
    estimate = job_cost_estimate(job(org, max_runtime_s=None), at=at(1))
    assert estimate.high is None and estimate.low is None
    assert estimate.per_hour_high == Decimal("4.72")


def test_the_priority_multiplier_and_the_rate_in_force_apply(org: Org) -> None:
    rates(org)
    dear = job(org, priority_class=f.priority("high"), flavors=["H100-80GB"])
    assert job_cost_estimate(dear, at=at(1)).per_hour_high == Decimal("4.72") * Decimal("1.5")
    later = job_cost_estimate(job(org, flavors=["H100-80GB"]), at=at(10))
    assert later.per_hour_high == Decimal(6)  # the new card has no CPU or memory price


def test_a_flavor_without_a_rate_is_named_and_left_out(org: Org) -> None:
    rates(org)
    f.FlavorFactory(name="L4")
    estimate = job_cost_estimate(job(org, flavors=["L4", "A100-40GB"]), at=at(1))
    assert estimate.unpriced == ("L4",)
    assert estimate.per_hour_low == estimate.per_hour_high == Decimal(2)
    assert estimate.as_json()["unpriced_flavors"] == ["L4"]
