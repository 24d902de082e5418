"""bench/philly.py: Philly's minute log of nodes in use read as node-hours a day, from the CSV or
from the git directory the fetch tool brings; absent, bench.forecast skips it and says why."""

from __future__ import annotations

import json
import subprocess
from datetime import datetime, timedelta
from pathlib import Path

import numpy as np
import pytest

from bench.forecast import main
from bench.philly import PATH_IN_REPO, HistoryMissing, parse_node_sequence, philly_history

TRACE_DIR = Path(__file__).resolve().parents[2] / "shared" / "bench" / "openb"


def minute_log(start: str, active: list[int]) -> str:
    """`time,active,total` one row a minute from `start`, as HeliosArtifact writes it."""
    t0 = datetime.fromisoformat(start)
    rows = [
        f"{(t0 + timedelta(minutes=i)).isoformat(sep=' ')},{a},420" for i, a in enumerate(active)
    ]
    return "time,active,total\n" + "\n".join(rows) + "\n"


def test_a_day_is_its_node_hours_over_whole_days_with_zeros_and_holes_as_gaps() -> None:
    # Starts at 23:58 (that day is not whole), then day 0: 720 minutes of 100 nodes and 720 of
    # 300: (720*100 + 720*300) / 60 = 4,800 node-hours. Day 1: 600 minutes of 250, 60 logged as
    # 0 (a gap, not an idle cluster) and 780 absent: 24 * 250 = 6,000 node-hours.
    # Day 2 runs 00:00..11:59 only (not whole): dropped.
    day0 = [100] * 720 + [300] * 720
    day1 = [250] * 600 + [0] * 60
    text = minute_log("2017-10-02 23:58:00", [7, 7, *day0])
    more = minute_log("2017-10-04 00:00:00", day1).split("\n", 1)[1]
    last = minute_log("2017-10-05 00:00:00", [999] * 720).split("\n", 1)[1]
    got = parse_node_sequence(text + more + last)
    assert got.first_day == "2017-10-03"
    np.testing.assert_allclose(got.node_hours, [4800.0, 6000.0])
    assert got.gap_minutes == 60 + 780


@pytest.mark.parametrize("form", ["csv", "git work tree", "git directory"])
def test_the_history_reads_from_the_csv_or_the_fetched_git_directory(
    tmp_path: Path, form: str
) -> None:
    text = minute_log("2017-10-03 00:00:00", [200] * 1440 + [300] * 1440)
    if form == "csv":
        source = tmp_path / "philly_node_sequence.csv"
        source.write_text(text)
    else:
        repo = tmp_path / "HeliosArtifact"
        (repo / PATH_IN_REPO).parent.mkdir(parents=True)
        (repo / PATH_IN_REPO).write_text(text)
        git = ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t"]
        subprocess.run(["git", "init", "-q", str(repo)], check=True)
        subprocess.run([*git, "add", "."], check=True)
        subprocess.run([*git, "commit", "-q", "-m", "data"], check=True)
        source = repo if form == "git work tree" else repo / ".git"
    np.testing.assert_allclose(philly_history(source).node_hours, [4800.0, 7200.0])


def test_a_missing_or_foreign_source_says_where_to_get_the_history(tmp_path: Path) -> None:
    with pytest.raises(HistoryMissing, match="S-Lab-System-Group/HeliosArtifact"):
        philly_history(tmp_path / "absent")
    with pytest.raises(HistoryMissing, match="neither the CSV nor a git directory"):
        philly_history(tmp_path)
    with pytest.raises(HistoryMissing, match="'time' and 'active'"):
        parse_node_sequence("when,nodes\n2017-10-03 00:00:00,3\n")


@pytest.mark.skipif(not TRACE_DIR.exists(), reason="the openb trace is not in ../shared")
def test_the_bench_measures_philly_beside_the_others(tmp_path: Path) -> None:
    # 28 days with a weekly shape: two 7-day origins a week apart, the first after 14 days.
    week = [300, 320, 330, 320, 310, 200, 180]
    log = tmp_path / "philly.csv"
    log.write_text(
        minute_log("2017-10-02 00:00:00", [a for d in range(28) for a in [week[d % 7]] * 1440])
    )
    out = tmp_path / "out.json"
    args = ["--days", "60", "--origins", "1", "--horizons", "7", "--openb-origins", "1"]
    philly = ["--philly", str(log), "--philly-horizon", "7", "--philly-origins", "2"]
    main(["--json", str(out), *args, *philly])
    got = json.loads(out.read_text())
    assert got["histories"]["philly"]["horizon_days"] == 7
    assert got["histories"]["philly"]["origins"] == 2
    assert got["data"]["philly"]["days"] == 28
    assert got["data"]["philly"]["first_day"] == "2017-10-02"
    assert got["skipped"] == {}
