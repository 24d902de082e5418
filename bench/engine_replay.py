"""The engine alone over the snapshots a real daemon built: record them once, then replay
them through `run_cycle` with a held base, as the daemon calls it, to time the engine and to
check that a change leaves every decision as it was.

    python -m bench.engine_replay record --out snaps.pkl      # runs bench.daemon_drain
    python -m bench.engine_replay replay snaps.pkl --results new.pkl [--repeat 3]
    python -m bench.engine_replay replay snaps.pkl --compare old.pkl

`record` runs the drain of `bench.daemon_drain` (fresh database `gantry_bench`) and keeps
each cycle's snapshot and profile. `replay` reports the best of `--repeat` passes over all
of them (the collector frozen, as in the daemon's loop); `--results` keeps the decisions,
`--compare` checks them against decisions kept by another version of the code (run it in
that version's checkout). The snapshots are pickles of `scheduler.core` types: replay them
with code whose types have the same fields.
"""

from __future__ import annotations

import argparse
import gc
import json
import pickle
import time
from pathlib import Path
from typing import Any

from bench.bench_profile import add_profile_argument, announced
from bench.daemon_setup import DEFAULT_URL, fresh_database


def record(out: Path, database_url: str, profile: str) -> dict[str, Any]:
    loaded, used = announced(profile)
    fresh_database(database_url)
    import scheduler.daemon.loop as daemon_module
    from bench.daemon_drain import drain

    snapshots: list[tuple[Any, Any]] = []
    engine = daemon_module.run_cycle

    def recording(snapshot: Any, profile: Any, **kwargs: Any) -> Any:
        snapshots.append((snapshot, profile))
        return engine(snapshot, profile, **kwargs)

    daemon_module.run_cycle = recording  # type: ignore[assignment]
    try:
        figures = drain({"medium": 100, "small": 350}, 300.0, profile=loaded.profile)
    finally:
        daemon_module.run_cycle = engine
    out.write_bytes(pickle.dumps(snapshots))
    return {
        "cycles": len(snapshots),
        "drain_s": figures["drain_s"],
        "out": str(out),
        "profile": used,
    }


def replay(snapshots_path: Path, repeat: int) -> tuple[dict[str, Any], list[Any]]:
    from scheduler.core import run_cycle
    from scheduler.core.context import Held

    snapshots = pickle.loads(snapshots_path.read_bytes())  # noqa: S301 - our own file
    times: list[float] = []
    results: list[Any] = []
    for _ in range(repeat):
        held, results = Held(), []
        gc.collect()
        gc.freeze()
        started = time.perf_counter()
        for snapshot, profile in snapshots:
            results.append(run_cycle(snapshot, profile, held=held))
        times.append(time.perf_counter() - started)
        gc.unfreeze()
    placed = sum(len(r.placements) for r in results)
    figures = {
        "cycles": len(snapshots),
        "placements": placed,
        "best_s": round(min(times), 3),
        "runs_s": [round(t, 3) for t in times],
        "ms_per_cycle": round(1000 * min(times) / max(len(snapshots), 1), 2),
    }
    return figures, results


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Record the daemon's snapshots; replay the engine")
    sub = parser.add_subparsers(dest="command", required=True)
    rec = sub.add_parser("record", help="run bench.daemon_drain and keep its snapshots")
    rec.add_argument("--out", type=Path, required=True)
    rec.add_argument("--database-url", default=DEFAULT_URL)
    add_profile_argument(rec, "no-min-runtime")
    rep = sub.add_parser("replay", help="run the engine over recorded snapshots")
    rep.add_argument("snapshots", type=Path)
    rep.add_argument("--repeat", type=int, default=3)
    rep.add_argument("--results", type=Path, help="keep the decisions here")
    rep.add_argument("--compare", type=Path, help="decisions kept by another version")
    args = parser.parse_args(argv)
    if args.command == "record":
        print(json.dumps(record(args.out, args.database_url, args.profile), indent=2))
        return
    figures, results = replay(args.snapshots, max(1, args.repeat))
    if args.results:
        args.results.write_bytes(pickle.dumps(results))
    if args.compare:
        other = pickle.loads(args.compare.read_bytes())  # noqa: S301 - our own file
        differ = [i for i, (a, b) in enumerate(zip(results, other, strict=True)) if a != b]
        figures["same_decisions"] = not differ
        figures["cycles_that_differ"] = differ[:20]
    print(json.dumps(figures, indent=2))


if __name__ == "__main__":
    main()
