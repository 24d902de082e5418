"""What a job may cost, before it runs: the figure budgets reserve and quotes show.

A job's cost per hour on a flavor is what metering would charge for it, at the unit prices
rating uses (`billing.rates.rating.Rate.unit_price`: the GPU share, CPU and memory of every
replica, times its priority class's multiplier, less the borrowed discount for a class that
does not count against quota, which metering always rates as borrowed), at the rates in
force now. A job that may run on several flavors costs between its cheapest and its dearest
one, so an estimate is a range:

- `low`: the cheapest flavor for the declared `estimated_runtime_s` (or the maximum when
  none is declared), one attempt at its submitted replicas;
- `high`: the worst case, the most the job can cost: the dearest flavor, the most replicas
  (an inference job's `max_replicas`), for every attempt it may make ((retry limit + 1) x
  the maximum runtime, which the daemon enforces per attempt). None when the runtime is
  unbounded.

Which card (issue 38, docs/multicluster.md): a job whose placement requires clusters (by name,
or by region) is priced at the cards of those clusters (each cluster's own, else the default
card), the range spanning them; any other job at the default card, the estimate saying which
clusters' own cards apply if it is placed there (`cards_note`).

Rates that change while the job runs are not foreseen: an estimate is priced at the rates in
force at `at`. Whether a job of a class that counts against quota borrows is known only when
it is placed, so its borrowed discount is not assumed: such an estimate errs high, the safe
side for a budget.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from decimal import ROUND_HALF_EVEN, Decimal
from typing import Any

from django.conf import settings

from billing.models import RateCard
from billing.rates import rating
from common.db.shared_reads import shared
from scheduler.jobs.approvals import job_attempts_max, job_replicas_max
from scheduler.models import Cluster
from tenants.selectors import flavor_names

CENT = Decimal("0.01")
SECONDS_PER_HOUR = Decimal(3600)
MIB_PER_GIB = Decimal(1024)


@dataclass(frozen=True)
class FlavorPrice:
    flavor: str
    per_hour: Decimal  # exact: the job's whole price for one hour on this flavor
    # The cluster whose card prices it; None: the default card (where the job will run is
    # not known).
    cluster: str | None = None


@dataclass(frozen=True)
class CostEstimate:
    """A job's cost range. Amounts are rounded to the cent (half-to-even, as statements).
    `per_hour_high` is for the most replicas, `per_hour_low` for the submitted ones;
    `high_runtime_s` is every attempt's maximum runtime together (what `high` prices)."""

    currency: str
    per_hour_low: Decimal
    per_hour_high: Decimal
    low: Decimal | None
    high: Decimal | None
    low_runtime_s: int | None
    high_runtime_s: int | None
    flavors: tuple[FlavorPrice, ...]
    unpriced: tuple[str, ...]  # flavors the job may run on that have no rate card at `at`
    attempts_max: int = 1  # retry limit + 1
    replicas_max: int = 1
    cards_note: str = ""  # which cards price it, when clusters have cards of their own

    def cost_for(self, seconds: int | float | Decimal) -> Decimal:
        """The dearest cost of running for `seconds` (e.g. until the month ends)."""
        return _cents(self.per_hour_high * Decimal(str(seconds)) / SECONDS_PER_HOUR)

    @property
    def worst_case_note(self) -> str:
        """The worst case in a sentence, e.g. 'Worst case EUR 84.21: 21 attempts (retry
        limit 20 + 1) of up to 600 s each, on the dearest allowed flavor.'"""
        if self.high is None:
            return "No maximum runtime: the worst case is unbounded."
        runtime = (self.high_runtime_s or 0) // self.attempts_max
        retries = self.attempts_max - 1
        attempts = (
            f"{self.attempts_max} attempts (retry limit {retries} + 1)"
            if retries
            else "one attempt"
        )
        replicas = f" at up to {self.replicas_max} replicas" if self.replicas_max > 1 else ""
        return (
            f"Worst case {self.currency} {self.high:,.2f}: {attempts} of up to {runtime} s "
            f"each{replicas}, on the dearest allowed flavor. Budgets reserve it and cost "
            "rules judge it."
        )

    def as_json(self) -> dict[str, Any]:
        def text(value: Decimal | None) -> str | None:
            return None if value is None else f"{value:f}"

        return {
            "currency": self.currency,
            "low": text(self.low),
            "high": text(self.high),
            "per_hour_low": text(_cents(self.per_hour_low)),
            "per_hour_high": text(_cents(self.per_hour_high)),
            "low_runtime_s": self.low_runtime_s,
            "high_runtime_s": self.high_runtime_s,
            "attempts_max": self.attempts_max,
            "replicas_max": self.replicas_max,
            "worst_case_cost": text(self.high),
            "worst_case_note": self.worst_case_note,
            "flavors": [
                {"flavor": f.flavor, "cluster": f.cluster, "per_hour": text(_cents(f.per_hour))}
                for f in self.flavors
            ],
            "unpriced_flavors": list(self.unpriced),
            "cards_note": self.cards_note,
        }


def _cents(value: Decimal) -> Decimal:
    return value.quantize(CENT, rounding=ROUND_HALF_EVEN)


def _rate(card: RateCard) -> rating.Rate:
    """`card` as rating prices it."""
    return rating.Rate(
        flavor=card.flavor.name,
        valid_from=card.valid_from,
        valid_to=card.valid_to,
        gpu_hour=card.gpu_hour,
        cpu_core_hour=card.cpu_core_hour,
        memory_gib_hour=card.memory_gib_hour,
        borrowed_discount=card.borrowed_discount,
        multipliers={m.priority_class.name: m.multiplier for m in card.multipliers.all()},
    )


def _hourly(rate: rating.Rate, job: Any, replicas: int) -> Decimal:
    """The job's price for one hour on `rate`'s flavor, `replicas` replicas together, at the
    unit prices metering rates it at (a class that does not count against quota is always
    metered as borrowed: billing/metering/hourly.py)."""
    klass = job.priority_class
    borrowed = not klass.counts_against_quota

    def price(resource: str) -> Decimal:
        return rate.unit_price(resource, klass.name, borrowed)

    gpus = Decimal(replicas * job.gpu_milli_per_replica) / 1000
    cores = Decimal(replicas * job.cpu_milli) / 1000
    gib = Decimal(replicas * job.memory_mib) / MIB_PER_GIB
    return gpus * price("gpu") + cores * price("cpu") + gib * price("memory")


def job_cost_estimate(job: Any, *, at: datetime) -> CostEstimate:
    """The cost range of `job` (a saved or unsaved scheduler Job) at the rates in force at `at`.

    The flavors are the job's allowed ones, or every flavor when it allows any. A flavor
    without a rate card at `at` is listed in `unpriced` and left out of the range; when no
    flavor has one, the range is zero (nothing would be charged at today's rates)."""
    names = list(job.flavors or [])
    if not names:
        names = flavor_names()
    cards = [
        card
        for card in rate_cards(tuple(names))
        if card.valid_from <= at and (card.valid_to is None or card.valid_to > at)
    ]
    required = required_clusters(job)
    priced_at, note = _cards_for(cards, required)
    replicas_max, attempts = job_replicas_max(job), job_attempts_max(job)
    rates = [_rate(card) for _, card in priced_at]
    prices = tuple(
        sorted(
            (
                FlavorPrice(card.flavor.name, _hourly(_rate(card), job, job.replicas), cluster)
                for cluster, card in priced_at
            ),
            key=lambda p: (p.per_hour, p.flavor, p.cluster or ""),
        )
    )
    priced = {p.flavor for p in prices}
    unpriced = tuple(sorted(set(names) - priced))
    low_hour = prices[0].per_hour if prices else Decimal(0)
    dearest = [_hourly(rate, job, replicas_max) for rate in rates]
    high_hour = max(dearest, default=Decimal(0))
    per_attempt = job.max_runtime_s
    high_runtime = None if per_attempt is None else per_attempt * attempts
    declared = (job.spec or {}).get("estimated_runtime_s") if isinstance(job.spec, dict) else None
    low_runtime = declared if declared is not None else per_attempt
    if per_attempt is not None and low_runtime is not None:
        low_runtime = min(low_runtime, per_attempt)

    def cost(per_hour: Decimal, seconds: int | None) -> Decimal | None:
        return None if seconds is None else _cents(per_hour * seconds / SECONDS_PER_HOUR)

    return CostEstimate(
        currency=settings.GANTRY_BILLING_CURRENCY,
        per_hour_low=low_hour,
        per_hour_high=high_hour,
        low=cost(low_hour, low_runtime),
        high=cost(high_hour, high_runtime),
        low_runtime_s=low_runtime,
        high_runtime_s=high_runtime,
        flavors=prices,
        unpriced=unpriced,
        attempts_max=attempts,
        replicas_max=replicas_max,
        cards_note=note,
    )


@shared
def rate_cards(flavors: tuple[str, ...]) -> list[RateCard]:
    """Every version of the cards of `flavors`, with their clusters and multipliers (a batch
    of submissions reads them once: common/db/shared_reads; the callers pick the versions in
    force at their moment)."""
    return list(
        RateCard.objects.filter(flavor__name__in=flavors)
        .select_related("flavor", "cluster")
        .prefetch_related("multipliers__priority_class")
    )


def required_clusters(job: Any) -> list[str] | None:
    """The names of the clusters the job's placement allows when it requires some (by name,
    or by region: the clusters labelled with one of them), by name; None when it may run in
    any cluster."""
    placement = (job.spec or {}).get("placement") if isinstance(job.spec, dict) else None
    placement = placement or {}
    names, regions = placement.get("clusters") or [], placement.get("regions") or []
    if not names and not regions:
        return None
    found = Cluster.objects.order_by("name")
    if names:
        found = found.filter(name__in=names)
    rows = list(found.values_list("name", "labels"))
    return [name for name, labels in rows if not regions or (labels or {}).get("region") in regions]


def _cards_for(
    cards: list[RateCard], required: list[str] | None
) -> tuple[list[tuple[str | None, RateCard]], str]:
    """(cluster or None, card) pairs that price the job, and the note saying so. A required
    cluster without a card of its own for a flavor is priced by the default card there."""
    default = {c.flavor.name: c for c in cards if c.cluster is None}
    own = {(c.cluster.name, c.flavor.name): c for c in cards if c.cluster is not None}
    if required is None:
        elsewhere = sorted({cluster for cluster, _ in own})
        note = (
            f"Priced at the default card; the card of cluster{'s' if len(elsewhere) > 1 else ''}"
            f" {', '.join(elsewhere)} applies if placed there."
            if elsewhere
            else ""
        )
        return [(None, card) for _, card in sorted(default.items())], note
    pairs: list[tuple[str | None, RateCard]] = []
    for cluster in required:
        for flavor in sorted({*default, *(f for c, f in own if c == cluster)}):
            card = own.get((cluster, flavor)) or default.get(flavor)
            if card is not None:
                pairs.append((cluster, card))
    said = [
        f"{cluster}'s card"
        if any(c == cluster for c, _ in own)
        else f"the default card ({cluster})"
        for cluster in required
    ]
    return pairs, f"Priced at {', '.join(said)}: the job must run there."
