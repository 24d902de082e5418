"""bench/dashboards.py at a tiny scale: it builds the history, ingests through the real path,
rolls up, times each dashboard and reports its JSON. No timing is asserted (the benchmark is
not a test)."""

from __future__ import annotations

from typing import Any

import pytest

from bench.dashboards import run_here
from scheduler.models import RollupPeriod, UtilizationRollup

pytestmark = pytest.mark.django_db


def test_the_dashboards_benchmark_reports_its_figures(db: Any) -> None:
    result = run_here(gpus=16, days=1, raw_hours=1, interval=60.0, repeat=2)
    assert set(result["p95_ms"]) == {"cluster", "tenant", "job"}
    assert all(value >= 0 for value in result["p95_ms"].values())
    assert set(result["p95_ms_by_range"]["cluster"]) == {"6h", "24h", "7d", "30d"}
    # 16 devices, one sample a minute for an hour, through samples_ingest.
    assert result["ingested"]["samples"] == 16 * 60
    assert result["ingest_samples_per_s"] > 0
    assert result["rollups_written_directly"] > 0 and result["queue_snapshots"] > 0
    # The day is there at both grains for every device: the 23 hours written directly and
    # the raw hour rolled up by rollup_run.
    hourly = UtilizationRollup.objects.filter(period=RollupPeriod.HOUR, scope="device")
    assert hourly.values("start").distinct().count() == 24
    assert hourly.values("key_id").distinct().count() == 16
