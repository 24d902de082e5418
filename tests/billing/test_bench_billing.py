"""bench/billing.py at a tiny scale: it builds, meters, closes and exports a day, and the
month it builds reconciles. No timing is asserted (the benchmark is not a test)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from bench.billing import run_here

KEYS = {
    "meter_s",
    "close_s",
    "export_s",
    "lines",
    "reconciled",
    "peak_rss_mib",
    "rss_growth_mib",
    "gpus",
    "days",
    "jobs",
    "seed",
}


def test_the_billing_benchmark_runs_and_reconciles(db: Any, tmp_path: Path) -> None:
    result = run_here(16, 1, 50, 1, tmp_path / "month.xlsx")
    assert set(result) >= KEYS
    assert result["reconciled"] is True, result["reconciliation"]
    assert result["jobs"] == 50 and result["lines"] > 0 and result["export_rows"] > 0
    assert (tmp_path / "month.xlsx").stat().st_size > 0
