"""How good are the demand forecasts? A rolling-origin backtest on two daily histories.

    python -m bench.forecast --json out.json
    python -m bench.forecast --trace-dir ../shared/bench/openb --horizon 30 --json out.json

(a) generated: `--days` (365) days of GPU-hours with a known linear growth and weekly season
    (weekdays busier than weekends) times seeded log-normal noise (`generated_history`);
(b) openb: the pod list (`openb_pod_list_default.csv`, bench.openb_trace's reader), each pod
    asking for its GPUs from creation to deletion, spread over days by the product's own
    arithmetic (capacity.daily); the last, partial day left out.

At each of `--origins` weekly origins the forecaster (capacity.forecast: AutoETS on log demand)
and the seasonal-naive baseline are fitted on the days before and scored on the next
`--horizon` days: MASE (scaled by the in-sample seasonal-naive error), sMAPE (utilsforecast's,
0..1) and the p10..p90 coverage, averaged over origins. Also reported: the baseline's own
scores and `relative_mae`, the forecast's MAE over the baseline's on the same days
(`baseline_scores`), and the seconds spent importing statsforecast and fitting (`timing`).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

import numpy as np

from bench.openb_trace import load_pod_lifetimes
from capacity.daily import DAY_S, daily_gpu_hours

DEFAULT_TRACE_DIR = Path(__file__).resolve().parents[2] / "shared" / "bench" / "openb"
# Weekday shape of the generated demand, Monday first: a working week, quieter weekends.
WEEK = (1.0, 1.05, 1.08, 1.06, 1.0, 0.72, 0.68)


def generated_history(
    days: int, *, seed: int, base: float = 200.0, growth: float = 1.2, noise: float = 0.06
) -> np.ndarray:
    """GPU-hours per day: (base + growth * day) * weekday shape * lognormal(0, noise)."""
    rng = np.random.default_rng(seed)
    t = np.arange(days)
    shape = np.asarray(WEEK)[t % 7]
    return (base + growth * t) * shape * rng.lognormal(0.0, noise, days)


def openb_history(trace_dir: Path, trace: str = "default") -> np.ndarray:
    created, deleted, gpus = load_pod_lifetimes(trace_dir, trace)
    full_days = int(max(deleted) // DAY_S)
    return daily_gpu_hours(created, deleted, gpus, first_day=0.0, days=full_days)


def _scores(acc: Any) -> dict[str, float]:
    return {"mase": acc.mase, "smape": acc.smape, "coverage": acc.coverage}


def measure(history: np.ndarray, horizon: int, origins: int) -> tuple[dict, dict]:
    from capacity.forecast import backtest, weekly_origins

    result = backtest(history, horizon, weekly_origins(len(history), horizon, origins))
    ours = {**_scores(result.forecast), "horizon_days": horizon, "origins": len(result.origins)}
    theirs = {**_scores(result.baseline), "relative_mae": result.relative_mae}
    return ours, theirs


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Backtest of the demand forecasts")
    parser.add_argument("--json", type=Path)
    parser.add_argument("--trace-dir", type=Path, default=DEFAULT_TRACE_DIR)
    parser.add_argument("--horizon", type=int, default=30, help="days forecast at each origin")
    parser.add_argument("--origins", type=int, default=8, help="weekly origins per history")
    parser.add_argument("--days", type=int, default=365, help="days of the generated history")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)

    started = time.perf_counter()
    from capacity.forecast import BASELINE, METHOD

    import_s = time.perf_counter() - started
    histories = {
        "generated": generated_history(args.days, seed=args.seed),
        "openb": openb_history(args.trace_dir),
    }
    out: dict[str, Any] = {"histories": {}, "method": METHOD, "baseline": BASELINE}
    baseline_scores: dict[str, Any] = {}
    timing: dict[str, float] = {"import_s": round(import_s, 2)}
    for name, history in histories.items():
        t0 = time.perf_counter()
        ours, theirs = measure(history, args.horizon, args.origins)
        timing[f"{name}_fit_s_per_origin"] = round((time.perf_counter() - t0) / args.origins, 3)
        out["histories"][name] = ours
        baseline_scores[name] = {**theirs, "days": len(history)}
    out["baseline_scores"] = baseline_scores
    out["timing"] = timing
    print(json.dumps(out, indent=2))
    if args.json:
        args.json.write_text(json.dumps(out, indent=2) + "\n")


if __name__ == "__main__":
    main()
