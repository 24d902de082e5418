"""Demand forecasts and their measured accuracy. Pure: no Django, no I/O (import contract).

`forecast_demand(history, horizon)` fits the forecaster (the candidate model that `choose`
picks on the history) and the seasonal-naive baseline beside it; `backtest(history, horizon,
origins)` measures both on a rolling origin. Importing this
package loads statsforecast (pandas, scipy): only the refresh task and the benchmark do, never
a page view.
"""

from capacity.forecast.accuracy import Accuracy, accuracy
from capacity.forecast.backtest import Backtest, backtest, rolling_origins, weekly_origins
from capacity.forecast.candidates import CANDIDATES, LEVEL, SEASON, Candidate
from capacity.forecast.choose import choose
from capacity.forecast.fit import BASELINE, METHOD, Forecast, forecast_demand

__all__ = [
    "BASELINE",
    "CANDIDATES",
    "LEVEL",
    "METHOD",
    "SEASON",
    "Accuracy",
    "Backtest",
    "Candidate",
    "Forecast",
    "accuracy",
    "backtest",
    "choose",
    "forecast_demand",
    "rolling_origins",
    "weekly_origins",
]
