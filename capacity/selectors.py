"""Reads of capacity planning: the latest forecast run and its series, targets, TCO inputs,
suggestions. Querysets with their joins; who sees what is capacity/access.py's."""

from __future__ import annotations

from django.conf import settings
from django.db.models import QuerySet

from capacity.models import (
    ForecastRun,
    ForecastRunState,
    PoolForecast,
    PoolTarget,
    RateSuggestion,
    TcoInputs,
)


def forecast_run_latest() -> ForecastRun | None:
    return ForecastRun.objects.filter(state=ForecastRunState.DONE).first()


def pool_forecast_list(run: ForecastRun) -> QuerySet[PoolForecast]:
    return PoolForecast.objects.filter(run=run).select_related("tenant")


def pool_targets() -> dict[str, float]:
    """Pool (flavor name) -> target utilization, for pools with one set."""
    return {
        name: float(t)
        for name, t in PoolTarget.objects.values_list("flavor__name", "target_utilization")
    }


def pool_target(flavor: str) -> float:
    return pool_targets().get(flavor, settings.GANTRY_CAPACITY_TARGET_UTILIZATION)


def tco_inputs_list() -> QuerySet[TcoInputs]:
    return TcoInputs.objects.select_related("flavor").order_by("flavor__name")


def rate_suggestion_list() -> QuerySet[RateSuggestion]:
    return RateSuggestion.objects.select_related("flavor", "created_by", "decided_by")
