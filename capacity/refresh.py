"""The forecast refresh: Celery beat's task body (capacity/tasks.py). Never at a page view.

1. claim: one run at a time (a constraint of the table); a run left running past
   STALE_AFTER (its worker died) is failed, and the claim taken again;
2. read the history (capacity/history.py) to yesterday, the last whole day;
3. forecast every series with demand (capacity/forecast: pure);
4. store the series and mark the run done; keep the last KEEP_RUNS ended runs.

Idempotent: a second delivery while one runs does nothing; one after it makes a newer run.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import datetime, timedelta

from django.conf import settings
from django.db import IntegrityError, transaction

from capacity.forecast import BASELINE, METHOD, Forecast, forecast_demand
from capacity.history import Window, demand_history, pool_capacity_gpus
from capacity.models import ForecastRun, ForecastRunState, PoolForecast

logger = logging.getLogger(__name__)

STALE_AFTER = timedelta(hours=2)
KEEP_RUNS = 5


def _claim(now: datetime) -> ForecastRun | None:
    ForecastRun.objects.filter(
        state=ForecastRunState.RUNNING, started_at__lt=now - STALE_AFTER
    ).update(state=ForecastRunState.FAILED, finished_at=now, error="stopped: its worker was lost")
    history_days = settings.GANTRY_CAPACITY_HISTORY_DAYS
    try:
        with transaction.atomic():
            return ForecastRun.objects.create(
                started_at=now,
                last_day=now.date() - timedelta(days=1),
                history_days=history_days,
                horizon_days=settings.GANTRY_CAPACITY_HORIZON_DAYS,
                method=METHOD,
                baseline=BASELINE,
            )
    except IntegrityError:
        return None  # another refresh is running


def _rows(
    run: ForecastRun, now: datetime, forecaster: Callable[..., Forecast]
) -> list[PoolForecast]:
    window = Window(
        first_day=run.last_day - timedelta(days=run.history_days - 1),
        days=run.history_days,
        now=now,
    )
    capacity = pool_capacity_gpus()
    rows = []
    for (flavor, tenant_id), measures in sorted(
        demand_history(window).items(), key=lambda kv: (kv[0][0], kv[0][1] or 0)
    ):
        requested = measures["requested"]
        if not requested.any():
            continue
        fc = forecaster(requested, run.horizon_days)
        rows.append(
            PoolForecast(
                run=run,
                flavor=flavor,
                tenant_id=tenant_id,
                requested=[round(float(v), 3) for v in requested],
                allocated=[round(float(v), 3) for v in measures["allocated"]],
                used=[round(float(v), 3) for v in measures["used"]],
                p10=[round(v, 3) for v in fc.p10],
                p50=[round(v, 3) for v in fc.p50],
                p90=[round(v, 3) for v in fc.p90],
                baseline=[round(v, 3) for v in fc.baseline],
                method=fc.method,
                capacity_gpus=capacity.get(flavor, 0.0),
            )
        )
    return rows


def forecast_refresh(
    *, now: datetime, forecaster: Callable[..., Forecast] = forecast_demand
) -> ForecastRun | None:
    """Refresh every forecast; None when another refresh holds the claim."""
    run = _claim(now)  # 1.
    if run is None:
        return None
    try:
        rows = _rows(run, now, forecaster)  # 2. and 3.
    except Exception as exc:
        logger.exception("capacity forecast run %s failed", run.pk)
        run.state, run.error, run.finished_at = ForecastRunState.FAILED, str(exc)[:500], now
        run.save(update_fields=["state", "error", "finished_at"])
        raise
    with transaction.atomic():  # 4.
        PoolForecast.objects.bulk_create(rows, batch_size=500)
        run.state, run.finished_at = ForecastRunState.DONE, now
        run.save(update_fields=["state", "finished_at"])
        ended = ForecastRun.objects.exclude(state=ForecastRunState.RUNNING)
        keep = list(ended.values_list("id", flat=True)[:KEEP_RUNS])  # newest first
        ended.exclude(id__in=keep).delete()
    return run
