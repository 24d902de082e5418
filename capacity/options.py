"""Expansion options priced: add N GPUs to a pool, owned or rented. Pure (saturation and TCO).

For an option of `gpus` more GPUs: the new saturation days (the pool's limit grown by
gpus x 24 x target), and each 30-day month's cost of serving the forecast demand above the
pool's limit today (p50) with those GPUs owned, rented on demand, or committed (capacity/tco.py).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import date

from capacity.saturation import Saturation, daily_limit, saturation
from capacity.tco import Costs, Figure, Month, break_even_month, option_months


@dataclass(frozen=True)
class Option:
    gpus: int
    saturation: Saturation
    months: tuple[Month, ...]
    break_even_month: Figure | None  # None without TCO inputs
    own_total: float
    on_demand_total: float
    committed_total: float


def gpus_to_cover(forecast: Sequence[float], *, capacity_gpus: float, target: float) -> int:
    """GPUs to add so that the forecast's peak day stays within the pool's limit."""
    peak = max(forecast, default=0.0)
    return max(math.ceil(peak / (24 * target) - capacity_gpus - 1e-9), 0)


def expansion_option(
    *,
    gpus: int,
    last_day: date,
    p50: Sequence[float],
    p90: Sequence[float],
    capacity_gpus: float,
    target: float,
    costs: Costs | None,
) -> Option:
    """The option of `gpus` more GPUs (negative: fewer, as a removal)."""
    grown = max(capacity_gpus + gpus, 0)
    sat = saturation(last_day=last_day, p50=p50, p90=p90, capacity_gpus=grown, target=target)
    if costs is None or gpus <= 0:
        return Option(gpus, sat, (), None, 0.0, 0.0, 0.0)
    limit = daily_limit(capacity_gpus, target)
    overflow = [max(d - limit, 0.0) for d in p50]
    months = tuple(option_months(costs, gpus, overflow))
    return Option(
        gpus=gpus,
        saturation=sat,
        months=months,
        break_even_month=break_even_month(costs, gpus, months),
        own_total=sum(m.own for m in months),
        on_demand_total=sum(m.on_demand for m in months),
        committed_total=sum(m.committed for m in months),
    )
