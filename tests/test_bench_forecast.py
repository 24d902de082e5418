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
    args = ["--days", "120", "--origins", "2", "--horizons", "14,21", "--openb-origins", "2"]
    main(["--json", str(out), *args, "--philly", str(tmp_path / "absent")])
    got = json.loads(out.read_text())
    assert set(got["histories"]) == {"generated", "openb"}  # philly is skipped, saying why:
    assert (
        "absent does not exist: fetch github:S-Lab-System-Group/HeliosArtifact"
        in (got["skipped"]["philly"])
    )
    for scores in got["histories"].values():
        assert set(scores) == {"mase", "smape", "coverage", "horizon_days", "origins"}
        assert scores["origins"] == 2
        assert 0 <= scores["coverage"] <= 1
    assert got["histories"]["generated"]["horizon_days"] == 14  # the first horizon asked
    assert got["histories"]["openb"]["horizon_days"] == 7
    assert set(got["by_horizon"]["generated"]) == {"14", "21"}
    assert got["by_horizon"]["generated"]["21"]["oracle_mase"] > 0
    assert "AutoETS" in got["method"]
    assert got["baseline"].startswith("SeasonalNaive")
    assert set(got["definitions"]) >= {"mase", "relative_mae"}


@pytest.mark.skipif(not TRACE_DIR.exists(), reason="the openb trace is not in ../shared")
def test_the_openb_history_holds_its_complete_days_only() -> None:
    # The pod list's first deletion is on day 115.3: before it only the pods that outlived it
    # are listed. Complete days: 116 up to the last whole day, 148.
    series, first = openb_history(TRACE_DIR)
    assert first == 116
    assert len(series) == 149 - 116
