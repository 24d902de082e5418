"""How good are the demand forecasts? A rolling-origin backtest on two daily histories.

    python -m bench.forecast --json out.json
    python -m bench.forecast --horizons 30 --origins 4 --json out.json

(a) generated: `--days` (365) days of GPU-hours with a known linear growth and weekly season
    (weekdays busier than weekends) times seeded log-normal noise (`generated_history`),
    forecast `--horizons` (30, 90, 180) days ahead from `--origins` weekly origins;
(b) openb: the pod list (`openb_pod_list_default.csv`, bench.openb.trace's reader), each pod
    asking for its GPUs from creation to deletion, spread over days by the product's own
    arithmetic (capacity.daily), over its complete days only (`openb_history`): 33 days, so
    `--openb-horizon` (7) days ahead from `--openb-origins` (13) origins `--openb-step` (1)
    days apart; `--openb-all-days` takes every day from day 0 instead (see openb_history);
(c) philly: Microsoft Philly's nodes in use, node-hours a day over 73 days of 2017
    (bench.philly: allocated nodes, not GPUs), read from `--philly` (the CSV or the git directory
    the fetch tool brings for github:S-Lab-System-Group/HeliosArtifact), forecast
    `--philly-horizon` (30) days ahead from `--philly-origins` (4) origins `--philly-step` (7)
    days apart. When it is absent the history is skipped and `skipped.philly` says why.

Each fit sees the last `--window` (180, the product's GANTRY_CAPACITY_HISTORY_DAYS) days before
its origin, as the refresh does; 0: every day before it. Scores, averaged over origins:
- MASE: the forecast's MAE over the in-sample MAE of seasonal naive (one week back) on the
  training window, utilsforecast's `mase`: below 1, the forecast errs less out of sample than
  last week's value did on the history. The issue's target is MASE < 1.
- relative MAE: the forecast's MAE over the seasonal-naive forecast's MAE on the same scored
  days (below 1: it beats the baseline out of sample). Not MASE; reported beside it.
- sMAPE (utilsforecast's, 0..1) and coverage: the share of days inside p10..p90.
`--candidates ets,theta-log` limits the models chosen from (one: that one alone, to compare
them). `--fit-horizon 180` forecasts 180 days at each origin and scores the first 30 or 90, as
the product reads them off its one forecast. `histories` holds the issue's keys at the first
horizon; `by_horizon` every horizon, with the baseline's own scores and, on the generated
history, the oracle's MASE: that of the noise-free curve the history was drawn around, the
least any forecaster can expect there.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np

from bench.openb.trace import load_pod_lifetimes
from bench.philly import DEFAULT_SOURCE as PHILLY_SOURCE
from bench.philly import HistoryMissing, philly_history
from capacity.daily import DAY_S, daily_gpu_hours

DEFAULT_TRACE_DIR = Path(__file__).resolve().parents[2] / "shared" / "bench" / "openb"
# Weekday shape of the generated demand, Monday first: a working week, quieter weekends.
WEEK = (1.0, 1.05, 1.08, 1.06, 1.0, 0.72, 0.68)
DEFINITIONS = {
    "mase": "forecast MAE / in-sample seasonal-naive (7-day) MAE on the training window"
    " (utilsforecast mase); the target is < 1",
    "relative_mae": "forecast MAE / seasonal-naive forecast MAE on the same scored days; not MASE",
    "coverage": "share of scored days inside p10..p90 (target 0.7..0.9)",
    "oracle_mase": "MASE of the noise-free curve the generated history was drawn around",
}


def generated_history(
    days: int, *, seed: int, base: float = 200.0, growth: float = 1.2, noise: float = 0.06
) -> np.ndarray:
    """GPU-hours per day: (base + growth * day) * weekday shape * lognormal(0, noise)."""
    rng = np.random.default_rng(seed)
    t = np.arange(days)
    shape = np.asarray(WEEK)[t % 7]
    return (base + growth * t) * shape * rng.lognormal(0.0, noise, days)


def openb_history(
    trace_dir: Path, trace: str = "default", *, all_days: bool = False
) -> tuple[np.ndarray, int]:
    """GPU-hours per day over the trace's complete days (`all_days`: from day 0, as earlier
    measurements took it), and the first of them.

    The pod list keeps the pods deleted after a cut (its first deletion, day 115.3): before
    that day only the pods that outlived it are there, and every pod created and deleted
    earlier is missing. A day is complete when every pod alive on it was deleted after the
    cut, so the complete days run from the first midnight after it to the last whole day."""
    created, deleted, gpus = load_pod_lifetimes(trace_dir, trace)
    first = 0 if all_days else math.ceil(min(deleted) / DAY_S)
    full_days = int(max(deleted) // DAY_S)
    series = daily_gpu_hours(
        created, deleted, gpus, first_day=first * DAY_S, days=full_days - first
    )
    return series, first


def _scores(acc: Any) -> dict[str, float]:
    return {"mase": acc.mase, "smape": acc.smape, "coverage": acc.coverage}


def _oracle_mase(curve: np.ndarray, history: np.ndarray, result: Any, window: int | None) -> float:
    from capacity.forecast import accuracy

    h = result.horizon_days
    scores = []
    for o in result.origins:
        p50 = curve[o : o + h]
        train = history[max(0, o - window) if window else 0 : o]
        scores.append(
            accuracy(train=train, actual=history[o : o + h], p50=p50, p10=p50, p90=p50).mase
        )
    return float(np.mean(scores))


def measure(
    history: np.ndarray,
    horizon: int,
    origins: tuple[int, ...],
    window: int | None,
    candidates: str | None = None,
    fit_horizon: int = 0,
) -> Any:
    """The backtest, with the candidates named by key (`ets,theta`; None: all of them)."""
    from capacity.forecast import CANDIDATES, backtest

    keys = candidates.split(",") if candidates else [c.key for c in CANDIDATES]
    pool = [c for c in CANDIDATES if c.key in keys]
    if len(pool) != len(keys):
        raise SystemExit(f"--candidates: choose among {', '.join(c.key for c in CANDIDATES)}")
    return backtest(
        history, horizon, origins, window=window, candidates=pool, fit_horizon=fit_horizon
    )


def _entry(result: Any) -> dict[str, Any]:
    return {
        **_scores(result.forecast),
        "origins": len(result.origins),
        "baseline": _scores(result.baseline),
        "relative_mae": result.relative_mae,
        "chosen": dict(Counter(m.split(",")[0] for m in result.methods)),
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Backtest of the demand forecasts")
    parser.add_argument("--json", type=Path)
    parser.add_argument("--trace-dir", type=Path, default=DEFAULT_TRACE_DIR)
    parser.add_argument("--horizons", default="30,90,180", help="generated: days ahead")
    parser.add_argument("--origins", type=int, default=8, help="generated: weekly origins")
    parser.add_argument("--days", type=int, default=365, help="days of the generated history")
    parser.add_argument("--window", type=int, default=180, help="days fitted on; 0: all")
    parser.add_argument("--openb-horizon", type=int, default=7)
    parser.add_argument("--openb-origins", type=int, default=13)
    parser.add_argument("--openb-step", type=int, default=1, help="days between openb origins")
    parser.add_argument(
        "--openb-all-days", action="store_true", help="from day 0, survivors-only days too"
    )
    parser.add_argument("--philly", type=Path, default=PHILLY_SOURCE, help="CSV or git dir")
    parser.add_argument("--philly-horizon", type=int, default=30)
    parser.add_argument("--philly-origins", type=int, default=4)
    parser.add_argument("--philly-step", type=int, default=7, help="days between its origins")
    parser.add_argument("--candidates", help="keys of the models to choose from (default all)")
    parser.add_argument(
        "--fit-horizon", type=int, default=0, help="forecast this far, score the first days"
    )
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    window = args.window or None

    started = time.perf_counter()
    from capacity.forecast import BASELINE, METHOD, rolling_origins

    timing: dict[str, float] = {"import_s": round(time.perf_counter() - started, 2)}
    generated = generated_history(args.days, seed=args.seed)
    curve = generated_history(args.days, seed=args.seed, noise=0.0)
    openb, openb_first = openb_history(args.trace_dir, all_days=args.openb_all_days)
    runs = [("generated", generated, int(h), args.origins, 7) for h in args.horizons.split(",")]
    runs.append(("openb", openb, args.openb_horizon, args.openb_origins, args.openb_step))
    data: dict[str, Any] = {
        "generated": {"days": len(generated), "training_days": window},
        "openb": {"days": len(openb), "first_day": openb_first, "training_days": window},
    }
    skipped: dict[str, str] = {}
    try:
        philly = philly_history(args.philly)
    except HistoryMissing as e:
        skipped["philly"] = str(e)
        print(f"philly skipped: {e}", file=sys.stderr)
    else:
        history = philly.node_hours
        runs.append(("philly", history, args.philly_horizon, args.philly_origins, args.philly_step))
        data["philly"] = {
            "days": len(history),
            "first_day": philly.first_day,
            "gap_minutes": philly.gap_minutes,
            "training_days": window,
            "demand": "allocated: node-hours a day of Philly nodes running jobs (not GPUs)",
        }
    by_horizon: dict[str, dict[str, Any]] = {name: {} for name in data}
    histories: dict[str, Any] = {}
    for name, history, horizon, count, step in runs:
        t0 = time.perf_counter()
        origins = rolling_origins(len(history), horizon, count, step)
        result = measure(history, horizon, origins, window, args.candidates, args.fit_horizon)
        timing[f"{name}_{horizon}_fit_s_per_origin"] = round((time.perf_counter() - t0) / count, 3)
        entry = _entry(result)
        if name == "generated":
            entry["oracle_mase"] = _oracle_mase(curve, history, result, window)
        by_horizon[name][str(horizon)] = entry
        if name not in histories:
            histories[name] = {
                **_scores(result.forecast),
                "horizon_days": horizon,
                "origins": len(result.origins),
            }
    out: dict[str, Any] = {
        "histories": histories,
        "method": METHOD if not args.candidates else f"{METHOD}; only {args.candidates}",
        "baseline": BASELINE,
        "definitions": DEFINITIONS,
        "by_horizon": by_horizon,
        "data": data,
        "skipped": skipped,
        "timing": timing,
    }
    print(json.dumps(out, indent=2))
    if args.json:
        args.json.write_text(json.dumps(out, indent=2) + "\n")


if __name__ == "__main__":
    main()
