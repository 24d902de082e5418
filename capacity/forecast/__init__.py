"""Demand forecasts and their measured accuracy. Pure: no Django, no I/O (import contract).

`forecast_demand(history, horizon)` fits the forecaster and the seasonal-naive baseline beside
it; `backtest(history, horizon, origins)` measures both on a rolling origin. Importing this
package loads statsforecast (pandas, scipy): only the refresh task and the benchmark do, never
a page view.
"""

from capacity.forecast.accuracy import Accuracy, accuracy
from capacity.forecast.backtest import Backtest, backtest, weekly_origins
from capacity.forecast.fit import (
    BASELINE,
    LEVEL,
    METHOD,
    SEASON,
    Forecast,
    forecast_demand,
)

__all__ = [
    "BASELINE",
    "LEVEL",
    "METHOD",
    "SEASON",
    "Accuracy",
    "Backtest",
    "Forecast",
    "accuracy",
    "backtest",
    "forecast_demand",
    "weekly_origins",
]
