"""One benchmark, alternately in two checkouts of the code on the same host at the same time,
so that the host's load falls on both alike: base, new, base, new, ...

    python -m bench.paired --base /work/base --runs 3 -- bench.daemon_drain --json {out}

Each run is `python -m MODULE ARGS` in its checkout (its own `.venv` when it has one), with
`{out}` in ARGS replaced by the JSON file the run writes and `{db}` by a database URL of its
own (the URL given, with _base or _new); without `{db}`, `--database-url URL` is added.
The benchmarks drop and create that database, so every run starts from a fresh one.
Prints, as a Markdown table, the figures that matter for the daemon's cost
(`bench.daemon_drain`: its CPU per job; its PostgreSQL session's, which the benchmark reads
from /proc for its connection's backend process, so 0 when PostgreSQL runs on another host;
their sum; the drain's wall time) for each pair of runs with the ratio new/base, and the
medians. `--json` keeps every run's output.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parents[1]
DEFAULT_DATABASE = "postgres://postgres@127.0.0.1:5432/gantry_paired"
FIGURES = ("daemon_cpu_ms_per_job", "postgres_cpu_ms_per_job", "drain_s")
# The target of issue 19 is on this sum: the daemon's CPU per job plus its PostgreSQL's.
TOTAL = "daemon+postgres_cpu_ms_per_job"
SIDES = ("base", "new")


@dataclass(frozen=True)
class Plan:
    checkouts: dict[str, Path]
    runs: int
    module: str
    args: tuple[str, ...]
    database: str
    out_dir: Path
    figures: tuple[str, ...]
    json_out: Path | None


def parse(argv: Sequence[str]) -> Plan:
    """Options before `--`, the benchmark's module and arguments after it."""
    argv = list(argv)
    if "--" not in argv:
        raise SystemExit("bench.paired: give the benchmark after --, e.g. -- bench.daemon_drain")
    split = argv.index("--")
    ours, theirs = argv[:split], argv[split + 1 :]
    parser = argparse.ArgumentParser(prog="python -m bench.paired", description=__doc__)
    parser.add_argument("--base", type=Path, required=True, help="the checkout to compare with")
    parser.add_argument("--new", type=Path, default=HERE, help="default: this checkout")
    parser.add_argument("--runs", type=int, default=3, help="pairs of runs")
    parser.add_argument("--database-url", default=DEFAULT_DATABASE, help="runs add _base, _new")
    parser.add_argument("--out-dir", type=Path, help="each run's JSON (default: a new temp dir)")
    parser.add_argument("--figure", action="append", help=f"a JSON key (default {FIGURES})")
    parser.add_argument("--json", type=Path, help="keep every run's output here")
    args = parser.parse_args(ours)
    if not theirs:
        parser.error("no benchmark module after --")
    if args.runs < 1:
        parser.error("--runs must be at least 1")
    if not any("{out}" in a for a in theirs[1:]):
        parser.error("the benchmark's arguments must say where it writes its JSON: {out}")
    for side, path in (("base", args.base), ("new", args.new)):
        if not (path / "bench").is_dir():
            parser.error(f"--{side} {path}: not a checkout of this project (no bench/)")
    out_dir = args.out_dir or Path(tempfile.mkdtemp(prefix="paired-"))
    return Plan(
        checkouts={"base": args.base.resolve(), "new": args.new.resolve()},
        runs=args.runs,
        module=theirs[0],
        args=tuple(theirs[1:]),
        database=args.database_url,
        out_dir=out_dir,
        figures=tuple(args.figure or FIGURES),
        json_out=args.json,
    )


def command(plan: Plan, side: str, run: int) -> tuple[list[str], Path]:
    """The command line of one run and the JSON file it writes."""
    checkout = plan.checkouts[side]
    out = plan.out_dir / f"{side}-{run}.json"
    database = f"{plan.database}_{side}"  # dropped and created again by each run
    args = [a.replace("{out}", str(out)).replace("{db}", database) for a in plan.args]
    if not any("{db}" in a for a in plan.args):
        args += ["--database-url", database]
    venv = checkout / ".venv" / "bin" / "python"
    python = str(venv) if venv.exists() else sys.executable
    return [python, "-m", plan.module, *args], out


def run_all(plan: Plan) -> list[dict[str, dict[str, Any]]]:
    """Every pair of runs, base first in each: [{"base": output, "new": output}, ...]."""
    plan.out_dir.mkdir(parents=True, exist_ok=True)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "DATABASE_URL")}
    pairs: list[dict[str, dict[str, Any]]] = []
    for run in range(1, plan.runs + 1):
        pair: dict[str, dict[str, Any]] = {}
        for side in SIDES:
            line, out = command(plan, side, run)
            load = os.getloadavg()[0]
            started = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime())
            print(f"bench.paired: run {run} {side}: {' '.join(line)}", file=sys.stderr)
            # The benchmark's own output goes to stderr: stdout is the table's.
            subprocess.run(line, cwd=plan.checkouts[side], env=env, stdout=sys.stderr, check=True)  # noqa: S603 - our own command line
            pair[side] = json.loads(out.read_text()) | {
                "_started_utc": started,
                "_load_average": round(load, 2),
            }
        pairs.append(pair)
    return pairs


def figures_of(output: Mapping[str, Any], figures: Sequence[str]) -> dict[str, float | None]:
    """The figures of one run's output (None where it has none), with the daemon's and
    PostgreSQL's CPU per job summed when both are there."""
    out: dict[str, float | None] = {}
    for key in figures:
        value = output.get(key)
        out[key] = float(value) if isinstance(value, int | float) else None
    daemon, postgres = out.get(FIGURES[0]), out.get(FIGURES[1])
    if daemon is not None and postgres is not None:
        out[TOTAL] = daemon + postgres
    return out


def table(pairs: Sequence[Mapping[str, Mapping[str, Any]]], figures: Sequence[str]) -> str:
    """A Markdown table: per pair of runs each figure's base, new and new/base, then the
    medians (the ratio's median is of the pairs' ratios)."""
    rows = [{side: figures_of(pair[side], figures) for side in SIDES} for pair in pairs]
    keys = [k for k in (*figures, TOTAL) if any(k in r["base"] for r in rows)]
    head = ["run", "load"] + [f"{k} {c}" for k in keys for c in ("base", "new", "new/base")]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    columns: dict[tuple[str, str], list[float]] = {}
    for i, (pair, row) in enumerate(zip(pairs, rows, strict=True), 1):
        loads = "/".join(_number(pair[s].get("_load_average")) for s in SIDES)
        cells = [str(i), loads]
        for key in keys:
            base, new = row["base"].get(key), row["new"].get(key)
            ratio = new / base if base and new is not None else None
            for column, value in (("base", base), ("new", new), ("ratio", ratio)):
                if value is not None:
                    columns.setdefault((key, column), []).append(value)
            cells += [_number(base), _number(new), _number(ratio)]
        lines.append("| " + " | ".join(cells) + " |")
    medians = ["median", ""]
    for key in keys:
        for column in ("base", "new", "ratio"):
            values = columns.get((key, column))
            medians.append(_number(statistics.median(values) if values else None))
    lines.append("| " + " | ".join(medians) + " |")
    unfinished = [
        f"run {i} {side}: {pair[side]['unfinished']} jobs unfinished"
        for i, pair in enumerate(pairs, 1)
        for side in SIDES
        if pair[side].get("unfinished")
    ]
    return "\n".join(lines + unfinished)


def _number(value: Any) -> str:
    if value is None:
        return "-"
    return f"{value:.3f}" if isinstance(value, float) else str(value)


def main(argv: Sequence[str] | None = None) -> None:
    plan = parse(sys.argv[1:] if argv is None else argv)
    pairs = run_all(plan)
    if plan.json_out is not None:
        plan.json_out.write_text(json.dumps(pairs, indent=2) + "\n")
    print(f"{plan.module} {' '.join(plan.args)}")
    print(f"base {plan.checkouts['base']}, new {plan.checkouts['new']}")
    print(f"each run's JSON in {plan.out_dir}")
    print(table(pairs, plan.figures))


if __name__ == "__main__":
    main()
