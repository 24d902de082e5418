"""bench/forecast.py: the JSON it writes (shape and the generated history's growth). No
timing is asserted; the figures themselves are measured by running it (docs/capacity.md)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from bench.forecast import generated_history, main, openb_history

TRACE_DIR = Path(__file__).resolve().parents[2] / "shared" / "bench" / "openb"


def test_the_generated_history_grows_with_a_weekly_season() -> None:
    y = generated_history(364, seed=1, noise=0.0)
    weeks = y.reshape(52, 7)
    assert np.all(np.diff(weeks.sum(axis=1)) > 0)  # every week more than the one before
    assert np.all(weeks[:, 5:].max(axis=1) < weeks[:, :5].min(axis=1))  # weekends quieter


@pytest.mark.skipif(not TRACE_DIR.exists(), reason="the openb trace is not in ../shared")
def test_the_json_holds_both_histories(tmp_path: Path) -> None:
    out = tmp_path / "out.json"
    main(["--json", str(out), "--days", "120", "--origins", "2", "--horizon", "14"])
    got = json.loads(out.read_text())
    assert set(got["histories"]) == {"generated", "openb"}
    for scores in got["histories"].values():
        assert set(scores) == {"mase", "smape", "coverage", "horizon_days", "origins"}
        assert scores["horizon_days"] == 14 and scores["origins"] == 2
        assert 0 <= scores["coverage"] <= 1
    assert got["method"].startswith("AutoETS")
    assert got["baseline"].startswith("SeasonalNaive")
    assert len(openb_history(TRACE_DIR)) == 149  # whole days of the trace
