"""What a viewer sees of the latest forecast run: per pool, the history and forecast band,
the saturation days, the drivers, expansion options and TCO figures (a platform admin's or
finance's view); or a tenant admin's subtrees' forecasts and drivers only (capacity/access.py).
Read only: no fit happens here (the refresh stored them)."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import date, timedelta
from typing import Any

from django.conf import settings

from capacity import access, selectors
from capacity.models import ForecastRun, PoolForecast
from capacity.options import Option, expansion_option, gpus_to_cover
from capacity.saturation import Driver, Saturation, drivers, saturation
from capacity.services import costs_of
from capacity.tco import Costs, Figure, break_even_utilization, chargeback_rate

DRIVERS_AT_DAY = 90  # drivers compare the last week with the week ending 90 days ahead
MAX_OPTION_GPUS = 10_000


@dataclass
class PoolPlan:
    flavor: str
    subtree: str | None  # a tenant's slug; None: the whole pool
    first_day: date
    last_day: date
    series: PoolForecast
    drivers: list[Driver]
    capacity_gpus: float | None = None  # pool views only, as below
    target: float | None = None
    saturation: Saturation | None = None
    options: list[Option] = field(default_factory=list)
    tco: dict[str, Figure] = field(default_factory=dict)


def _leaves(rows: list[PoolForecast], under: str = "") -> list[PoolForecast]:
    """Subtree rows under `under` (a path) with no other row below them: their demand is
    nobody else's, so their growth adds up without counting a team twice."""
    subs = [r for r in rows if r.tenant is not None and r.tenant.path.startswith(under)]
    paths = [r.tenant.path for r in subs if r.tenant is not None]
    return [
        r
        for r in subs
        if r.tenant is not None
        and not any(p != r.tenant.path and p.startswith(r.tenant.path) for p in paths)
    ]


def _drivers(rows: list[PoolForecast]) -> list[Driver]:
    return drivers(
        {r.tenant.slug: (r.requested, r.p50) for r in rows if r.tenant is not None},
        at_day=DRIVERS_AT_DAY,
    )


def _tco(costs: Costs | None, target: float, currency: str) -> dict[str, Figure]:
    if costs is None:
        return {}
    return {
        "break_even_utilization": break_even_utilization(costs),
        "chargeback_rate": chargeback_rate(costs, target, currency),
    }


def _options(
    row: PoolForecast, last_day: date, target: float, costs: Costs | None, extra: int | None
) -> list[Option]:
    cover = dict(capacity_gpus=row.capacity_gpus, target=target)
    sizes = {gpus_to_cover(row.p50, **cover), gpus_to_cover(row.p90, **cover)}
    if extra is not None:
        sizes.add(max(min(extra, MAX_OPTION_GPUS), -int(row.capacity_gpus)))
    return [
        expansion_option(gpus=n, last_day=last_day, p50=row.p50, p90=row.p90, costs=costs, **cover)
        for n in sorted(sizes)
        if n != 0
    ]


def capacity_plans(
    user: Any, *, run: ForecastRun, flavor: str | None = None, extra_gpus: int | None = None
) -> list[PoolPlan]:
    """The plans `user` may see from `run`, pools in name order (one pool with `flavor`)."""
    rows = list(selectors.pool_forecast_list(run))
    if flavor is not None:
        rows = [r for r in rows if r.flavor == flavor]
    first_day = run.last_day - timedelta(days=run.history_days - 1)
    by_pool: dict[str, list[PoolForecast]] = {}
    for row in rows:
        by_pool.setdefault(row.flavor, []).append(row)
    plans: list[PoolPlan] = []
    if access.sees_pools(user):
        costs = {t.flavor.name: costs_of(t) for t in selectors.tco_inputs_list()}
        targets = selectors.pool_targets()  # one read for every pool
        currency = settings.GANTRY_BILLING_CURRENCY
        for name, pool_rows in sorted(by_pool.items()):
            whole = next((r for r in pool_rows if r.tenant is None), None)
            if whole is None:
                continue
            target = targets.get(name, settings.GANTRY_CAPACITY_TARGET_UTILIZATION)
            plans.append(
                PoolPlan(
                    flavor=name,
                    subtree=None,
                    first_day=first_day,
                    last_day=run.last_day,
                    series=whole,
                    drivers=_drivers(_leaves(pool_rows)),
                    capacity_gpus=whole.capacity_gpus,
                    target=target,
                    saturation=saturation(
                        last_day=run.last_day,
                        p50=whole.p50,
                        p90=whole.p90,
                        capacity_gpus=whole.capacity_gpus,
                        target=target,
                    ),
                    options=_options(whole, run.last_day, target, costs.get(name), extra_gpus),
                    tco=_tco(costs.get(name), target, currency),
                )
            )
        return plans
    for root in access.subtree_roots(user):
        for name, pool_rows in sorted(by_pool.items()):
            own = next((r for r in pool_rows if r.tenant_id == root.pk), None)
            if own is None:
                continue
            below = [r for r in _leaves(pool_rows, root.path) if r.tenant_id != root.pk]
            plans.append(
                PoolPlan(
                    flavor=name,
                    subtree=root.slug,
                    first_day=first_day,
                    last_day=run.last_day,
                    series=own,
                    drivers=_drivers(below),
                )
            )
    return plans
