"""What a job may cost, before it runs: the figure budgets reserve and quotes show.

A job's cost per hour on a flavor is what metering would charge for it (billing/rating.py's
unit prices: the GPU share, CPU and memory of every replica, times its priority class's
multiplier), at the rates in force now. A job that may run on several flavors costs between
its cheapest and its dearest one, so an estimate is a range:

- `low`: the cheapest flavor for the declared `estimated_runtime_s` (or the maximum when
  none is declared);
- `high`: the dearest flavor for the maximum runtime, the most the job can cost (the daemon
  stops it at its maximum). None when the runtime is unbounded.

Rates that change while the job runs are not foreseen: an estimate is priced at the rates in
force at `at`. Borrowed-capacity discounts are not assumed either (whether a job borrows is
known only when it is placed), so an estimate errs high, which is the safe side for a budget.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from decimal import ROUND_HALF_EVEN, Decimal
from typing import Any

from django.conf import settings
from django.db.models import Q

from billing.models import RateCard
from tenants.models import ResourceFlavor

CENT = Decimal("0.01")
SECONDS_PER_HOUR = Decimal(3600)
MIB_PER_GIB = Decimal(1024)


@dataclass(frozen=True)
class FlavorPrice:
    flavor: str
    per_hour: Decimal  # exact: the job's whole price for one hour on this flavor


@dataclass(frozen=True)
class CostEstimate:
    """A job's cost range. Amounts are rounded to the cent (half-to-even, as statements)."""

    currency: str
    per_hour_low: Decimal
    per_hour_high: Decimal
    low: Decimal | None
    high: Decimal | None
    low_runtime_s: int | None
    high_runtime_s: int | None
    flavors: tuple[FlavorPrice, ...]
    unpriced: tuple[str, ...]  # flavors the job may run on that have no rate card at `at`

    def cost_for(self, seconds: int | float | Decimal) -> Decimal:
        """The dearest cost of running for `seconds` (e.g. until the month ends)."""
        return _cents(self.per_hour_high * Decimal(str(seconds)) / SECONDS_PER_HOUR)

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
            "flavors": [
                {"flavor": f.flavor, "per_hour": text(_cents(f.per_hour))} for f in self.flavors
            ],
            "unpriced_flavors": list(self.unpriced),
        }


def _cents(value: Decimal) -> Decimal:
    return value.quantize(CENT, rounding=ROUND_HALF_EVEN)


def _hourly(card: RateCard, job: Any) -> Decimal:
    """The job's price for one hour on `card`'s flavor, every replica together."""
    multiplier = next(
        (
            m.multiplier
            for m in card.multipliers.all()
            if m.priority_class_id == job.priority_class_id
        ),
        Decimal(1),
    )
    gpus = Decimal(job.replicas * job.gpu_milli_per_replica) / 1000
    cores = Decimal(job.replicas * job.cpu_milli) / 1000
    gib = Decimal(job.replicas * job.memory_mib) / MIB_PER_GIB
    base = gpus * card.gpu_hour + cores * card.cpu_core_hour + gib * card.memory_gib_hour
    return base * multiplier


def job_cost_estimate(job: Any, *, at: datetime) -> CostEstimate:
    """The cost range of `job` (a saved or unsaved scheduler Job) at the rates in force at `at`.

    The flavors are the job's allowed ones, or every flavor when it allows any. A flavor
    without a rate card at `at` is listed in `unpriced` and left out of the range; when no
    flavor has one, the range is zero (nothing would be charged at today's rates)."""
    names = list(job.flavors or [])
    if not names:
        names = list(ResourceFlavor.objects.order_by("name").values_list("name", flat=True))
    cards = (
        RateCard.objects.filter(flavor__name__in=names, valid_from__lte=at)
        .filter(Q(valid_to__isnull=True) | Q(valid_to__gt=at))
        .select_related("flavor")
        .prefetch_related("multipliers")
    )
    prices = tuple(
        sorted(
            (FlavorPrice(card.flavor.name, _hourly(card, job)) for card in cards),
            key=lambda p: (p.per_hour, p.flavor),
        )
    )
    priced = {p.flavor for p in prices}
    unpriced = tuple(sorted(set(names) - priced))
    low_hour = prices[0].per_hour if prices else Decimal(0)
    high_hour = prices[-1].per_hour if prices else Decimal(0)
    high_runtime = job.max_runtime_s
    declared = (job.spec or {}).get("estimated_runtime_s") if isinstance(job.spec, dict) else None
    low_runtime = declared if declared is not None else high_runtime
    if high_runtime is not None and low_runtime is not None:
        low_runtime = min(low_runtime, high_runtime)

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
    )
