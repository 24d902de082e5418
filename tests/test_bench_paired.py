"""bench/paired.py: its command line, each run's command, and the table it prints. No
benchmark is run and no timing is asserted: the figures below are made up."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from bench.paired import TOTAL, command, figures_of, parse, table


def _checkout(tmp_path: Path, name: str) -> Path:
    (tmp_path / name / "bench").mkdir(parents=True)
    return tmp_path / name


def test_options_before_the_double_dash_and_the_benchmark_after_it(tmp_path: Path) -> None:
    base, new = _checkout(tmp_path, "base"), _checkout(tmp_path, "new")
    plan = parse(
        ["--base", str(base), "--new", str(new), "--runs", "2", "--out-dir", str(tmp_path),
         "--", "bench.daemon_drain", "--json", "{out}", "--per-team", "5"]
    )  # fmt: skip
    assert plan.checkouts == {"base": base.resolve(), "new": new.resolve()}
    assert plan.runs == 2
    assert plan.module == "bench.daemon_drain"
    assert plan.args == ("--json", "{out}", "--per-team", "5")
    assert plan.figures == ("daemon_cpu_ms_per_job", "postgres_cpu_ms_per_job", "drain_s")


def test_each_run_writes_its_own_json_on_its_own_database(tmp_path: Path) -> None:
    base, new = _checkout(tmp_path, "base"), _checkout(tmp_path, "new")
    plan = parse(
        ["--base", str(base), "--new", str(new), "--out-dir", str(tmp_path / "out"),
         "--database-url", "postgres://h/gantry_x", "--", "bench.daemon_drain", "--json", "{out}"]
    )  # fmt: skip
    line, out = command(plan, "base", 1)
    assert line[1:] == [
        "-m",
        "bench.daemon_drain",
        "--json",
        str(tmp_path / "out" / "base-1.json"),
        "--database-url",
        "postgres://h/gantry_x_base",
    ]
    assert out == tmp_path / "out" / "base-1.json"
    assert command(plan, "new", 2)[1] == tmp_path / "out" / "new-2.json"
    assert command(plan, "new", 2)[0][-1] == "postgres://h/gantry_x_new"


def test_a_database_placeholder_takes_the_place_of_the_added_option(tmp_path: Path) -> None:
    base = _checkout(tmp_path, "base")
    plan = parse(["--base", str(base), "--", "bench.eta", "--url", "{db}", "--json", "{out}"])
    line, _ = command(plan, "new", 1)
    assert line[3:5] == ["--url", "postgres://postgres@127.0.0.1:5432/gantry_paired_new"]
    assert "--database-url" not in line


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["--base", "{base}", "bench.daemon_drain"], "after --"),
        (["--base", "{base}", "--"], "no benchmark module"),
        (["--base", "{base}", "--", "bench.daemon_drain", "--json", "x.json"], "{out}"),
        (["--base", "{base}", "--runs", "0", "--", "m", "--json", "{out}"], "--runs"),
        (["--base", "{nowhere}", "--", "m", "--json", "{out}"], "not a checkout"),
    ],
)
def test_a_command_line_that_cannot_work_is_refused_with_what_is_wrong(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], argv: list[str], says: str
) -> None:
    base = _checkout(tmp_path, "base")
    places = {"{base}": str(base), "{nowhere}": str(tmp_path / "nowhere")}
    argv = [places.get(a, a) for a in argv]
    with pytest.raises(SystemExit) as raised:
        parse(argv)
    assert says in str(raised.value.code) + capsys.readouterr().err


def _run(daemon: float, postgres: float, drain: float, **more: Any) -> dict[str, Any]:
    return {
        "daemon_cpu_ms_per_job": daemon,
        "postgres_cpu_ms_per_job": postgres,
        "drain_s": drain,
        "_load_average": 1.5,
    } | more


def test_the_daemons_and_postgresqls_cpu_per_job_are_summed() -> None:
    got = figures_of(_run(0.7, 0.45, 24.0), ("daemon_cpu_ms_per_job", "postgres_cpu_ms_per_job"))
    assert got[TOTAL] == pytest.approx(1.15)
    assert TOTAL not in figures_of({"daemon_cpu_ms_per_job": 0.7}, ("daemon_cpu_ms_per_job",))


def test_the_table_gives_each_pairs_ratio_new_over_base_and_the_medians() -> None:
    pairs = [
        {"base": _run(0.7, 0.4, 20.0), "new": _run(0.35, 0.2, 10.0)},
        {"base": _run(0.8, 0.4, 30.0), "new": _run(0.6, 0.3, 30.0)},
        {"base": _run(0.6, 0.6, 25.0), "new": _run(0.6, 0.6, 20.0)},
    ]
    lines = table(pairs, ("daemon_cpu_ms_per_job", "postgres_cpu_ms_per_job", "drain_s"))
    rows = [[c.strip() for c in line.strip("|").split("|")] for line in lines.splitlines()]
    head = rows[0]
    assert head[:5] == [
        "run",
        "load",
        "daemon_cpu_ms_per_job base",
        "daemon_cpu_ms_per_job new",
        "daemon_cpu_ms_per_job new/base",
    ]
    assert head[-3:] == [f"{TOTAL} base", f"{TOTAL} new", f"{TOTAL} new/base"]
    by_name = [dict(zip(head, row, strict=True)) for row in rows[2:]]
    assert [r["run"] for r in by_name] == ["1", "2", "3", "median"]
    assert by_name[0]["load"] == "1.500/1.500"
    assert by_name[0]["daemon_cpu_ms_per_job new/base"] == "0.500"
    assert by_name[1][f"{TOTAL} base"] == "1.200"
    assert by_name[1][f"{TOTAL} new/base"] == "0.750"
    assert by_name[2]["drain_s new/base"] == "0.800"
    median = by_name[3]
    assert median["drain_s base"] == "25.000"
    assert median["drain_s new"] == "20.000"
    assert median["drain_s new/base"] == "0.800"  # of the ratios 0.5, 1.0, 0.8
    assert median[f"{TOTAL} new/base"] == "0.750"  # of 0.5, 0.75, 1.0


def test_a_figure_a_run_lacks_is_a_dash_and_unfinished_jobs_are_said() -> None:
    pairs = [{"base": _run(0.7, 0.4, 20.0), "new": {"drain_s": 10.0, "unfinished": 3}}]
    lines = table(pairs, ("daemon_cpu_ms_per_job", "postgres_cpu_ms_per_job", "drain_s"))
    row = lines.splitlines()[2]
    assert "| 0.700 | - | - |" in row
    assert lines.splitlines()[-1] == "run 1 new: 3 jobs unfinished"
