"""Expansion what-ifs from the forecasts: "add N GPUs of model M", "remove N", "move N from
pool A to B", replayed by the what-if simulator (whatif/inventory.py) against the demand the
forecast expects `at_day` days ahead, and the new saturation day beside it.

The demand scale is the forecast's mean p50 over the `window_days` days ending `at_day` days
ahead, over the mean requested GPU-hours of the history's last `window_days` days: the
window's real jobs, replayed that many times over, stand for the demand to come.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.core.exceptions import ValidationError

from capacity import selectors
from capacity.models import PoolForecast
from capacity.options import Option, expansion_option
from whatif.inventory import DEMAND, INVENTORY
from whatif.models import WhatIf
from whatif.runs import whatif_expansion_start

MIN_SCALE, MAX_SCALE = 0.1, 10.0


@dataclass(frozen=True)
class Expansion:
    run: WhatIf
    demand_scale: float
    option: Option  # the pool's new saturation days (a move within a model changes none)


def demand_scale(series: PoolForecast, *, window_days: int, at_day: int) -> float:
    """See the module; clipped to MIN_SCALE..MAX_SCALE."""
    recent = series.requested[-window_days:]
    ahead = series.p50[max(at_day - window_days, 0) : at_day]
    base = sum(recent) / len(recent) if recent else 0.0
    if base <= 0 or not ahead:
        raise ValidationError({"flavor": ["no demand in the history's last days to scale."]})
    return min(max(sum(ahead) / len(ahead) / base, MIN_SCALE), MAX_SCALE)


def expansion_start(
    *,
    user: Any,
    flavor: str,
    action: str,
    gpus: int,
    from_pool: str | None = None,
    to_pool: str | None = None,
    window_days: int = 14,
    at_day: int = 90,
    now: datetime,
) -> Expansion:
    """Start the what-if run of an expansion (platform admins; whatif.runs decides)."""
    run = selectors.forecast_run_latest()
    series = (
        None
        if run is None
        else (selectors.pool_forecast_list(run).filter(flavor=flavor, tenant=None).first())
    )
    if run is None or series is None:
        raise ValidationError({"flavor": [f"no forecast of {flavor} yet (the refresh makes it)."]})
    if not 1 <= at_day <= run.horizon_days:
        raise ValidationError({"at_day": [f"from 1 to the forecast's {run.horizon_days} days."]})
    scale = demand_scale(series, window_days=window_days, at_day=at_day)
    inventory: dict[str, Any] = {
        "kind": INVENTORY,
        "action": action,
        "flavor": flavor,
        "gpus": gpus,
    }
    if action == "move":
        inventory.update(from_pool=from_pool, to_pool=to_pool)
    demand = {"kind": DEMAND, "flavor": flavor, "scale": round(scale, 3), "at_day": at_day}
    started = whatif_expansion_start(
        user=user, window_days=window_days, changes=[demand, inventory], now=now
    )
    change = {"add": gpus, "remove": -gpus}.get(action, 0)
    option = expansion_option(
        gpus=change,
        last_day=run.last_day,
        p50=series.p50,
        p90=series.p90,
        capacity_gpus=series.capacity_gpus,
        target=selectors.pool_target(flavor),
        costs=None,
    )
    return Expansion(started, scale, option)
