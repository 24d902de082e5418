"""Capacity's tables: forecast runs and their series, each pool's target utilization, TCO
inputs, and rate-card suggestions (one module per concept)."""

from capacity.models.forecasts import ForecastRun, ForecastRunState, PoolForecast
from capacity.models.plans import PoolTarget, RateSuggestion, SuggestionState, TcoInputs

__all__ = [
    "ForecastRun",
    "ForecastRunState",
    "PoolForecast",
    "PoolTarget",
    "RateSuggestion",
    "SuggestionState",
    "TcoInputs",
]
