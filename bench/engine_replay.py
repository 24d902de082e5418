"""The engine alone over the snapshots a real daemon built: record them once, then replay
them through `run_cycle` with a held base, as the daemon calls it, to time the engine and to
check that a change leaves every decision as it was; and, for a change to the daemon's reads,
check that two versions of the code build the same snapshots from the same database.

    python -m bench.engine_replay record --out snaps.pkl      # runs bench.daemon_drain
    python -m bench.engine_replay replay snaps.pkl --results new.pkl [--repeat 3]
    python -m bench.engine_replay replay snaps.pkl --compare old.pkl
    python -m bench.engine_replay snapshots --out new.json [--cycles 40] [--compare old.json]
    python -m bench.engine_replay diff new.json old.json [--rename Type.old=new ...]

`record` runs the drain of `bench.daemon_drain` (fresh database `gantry_bench`) and keeps
each cycle's snapshot and profile. `replay` reports the best of `--repeat` passes over all
of them (the collector frozen, as in the daemon's loop); `--results` keeps the decisions,
`--compare` checks them against decisions kept by another version of the code (run it in
that version's checkout). The snapshots are pickles of `scheduler.core` types: replay them
with code whose types have the same fields.

`snapshots` seeds a fresh database as `bench.daemon_drain` does, on a clock only it moves
(`--step-s` between cycles, Django's `timezone.now` on the same clock), runs the daemon's
first `--cycles` cycles on the simulated cluster and writes each snapshot the daemon passed
to the engine, and the engine's decisions, as JSON: dataclasses as dicts of their fields
(with `__type__`), enums as their values, mappings with sorted keys. The same settings give
the same file in every run, so the files of two checkouts compare field by field, whatever
their modules and classes look like. `--compare old.json` names the first cycle and field
that differ, and which fields differ how often (`diff` compares two such files);
`--rename Type.old=new` (repeatable) maps a field renamed on purpose. To run this file
on another checkout's code (`-P`: not this file's folder first on the path, where
`bench/billing.py` would hide the `billing` app):

    cd OTHER && PYTHONPATH=. .venv/bin/python -P THIS/bench/engine_replay.py snapshots ...
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import gc
import importlib
import json
import pickle
import re
import subprocess
import time
from collections import Counter
from collections.abc import Callable, Iterator, Mapping
from datetime import UTC, date, datetime
from enum import Enum
from pathlib import Path
from types import ModuleType
from typing import Any

from bench.bench_profile import add_profile_argument, announced
from bench.daemon_setup import DEFAULT_URL, fresh_database

# Where the daemon's loop imports `run_cycle`: the package's loop, or the single module
# it was before the daemon became a package.
DAEMON_MODULES = ("scheduler.daemon.loop", "scheduler.daemon")
SNAPSHOT_FORMAT = 1
# The fixed clock's start: any fixed instant will do, it only has to be the same in every run.
CLOCK_START = datetime(2026, 1, 5, 9, 0, tzinfo=UTC).timestamp()
ABSENT = "<absent>"


def _first(attribute: str, modules: tuple[str, ...]) -> Any:
    """`attribute` of the first of `modules` that exists and has it (layouts differ)."""
    for name in modules:
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as error:
            if error.name is None or not name.startswith(error.name):
                raise  # the module exists but something it imports does not
            continue
        if hasattr(module, attribute):
            return getattr(module, attribute)
    raise LookupError(f"none of {', '.join(modules)} has {attribute!r}")


def daemon_module() -> ModuleType:
    """The module whose `run_cycle` the daemon's cycle calls."""
    loop = _first("Daemon", DAEMON_MODULES)
    return importlib.import_module(loop.__module__)


@contextlib.contextmanager
def recorded_engine(into: list[tuple[Any, Any, Any]]) -> Iterator[None]:
    """While in the block, each call of the daemon's engine appends (snapshot, profile,
    result) to `into`."""
    module = daemon_module()
    engine = module.run_cycle  # type: ignore[attr-defined]

    def recording(snapshot: Any, profile: Any, **kwargs: Any) -> Any:
        result = engine(snapshot, profile, **kwargs)
        into.append((snapshot, profile, result))
        return result

    module.run_cycle = recording  # type: ignore[attr-defined]
    try:
        yield
    finally:
        module.run_cycle = engine  # type: ignore[attr-defined]


def record(out: Path, database_url: str, profile: str) -> dict[str, Any]:
    loaded, used = announced(profile)
    fresh_database(database_url)
    from bench.daemon_drain import drain

    calls: list[tuple[Any, Any, Any]] = []
    with recorded_engine(calls):
        figures = drain({"medium": 100, "small": 350}, 300.0, profile=loaded.profile)
    snapshots = [(snapshot, used_profile) for snapshot, used_profile, _ in calls]
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


# --- snapshots, version-independent ---------------------------------------------------------


def canonical(value: Any) -> Any:
    """`value` as JSON data that does not depend on how the classes are laid out: a
    dataclass as the dict of its fields plus `__type__` (its class's name), an enum as its
    value, a set sorted, a datetime in ISO form."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        out = {f.name: canonical(getattr(value, f.name)) for f in dataclasses.fields(value)}
        out["__type__"] = type(value).__name__
        return out
    if isinstance(value, Enum):
        return canonical(value.value)
    if isinstance(value, Mapping):
        return {str(canonical(k)): canonical(v) for k, v in value.items()}
    if isinstance(value, set | frozenset):
        return sorted((canonical(v) for v in value), key=_sort_key)
    if isinstance(value, list | tuple):
        return [canonical(v) for v in value]
    if isinstance(value, datetime | date):
        return value.isoformat()
    if value is None or isinstance(value, str | int | float):
        return value
    raise TypeError(f"no canonical form for {type(value).__name__}: {value!r}")


def _sort_key(value: Any) -> str:
    return json.dumps(value, sort_keys=True)


def renamed(value: Any, renames: Mapping[tuple[str, str], str]) -> Any:
    """Canonical data with fields renamed: (type name, old field) -> new field."""
    if isinstance(value, dict):
        kind = value.get("__type__")
        return {
            renames.get((kind, k), k) if isinstance(kind, str) else k: renamed(v, renames)
            for k, v in value.items()
        }
    if isinstance(value, list):
        return [renamed(v, renames) for v in value]
    return value


def parse_renames(specs: list[str]) -> dict[tuple[str, str], str]:
    """`Type.old=new` -> {(Type, old): new}."""
    out: dict[tuple[str, str], str] = {}
    for spec in specs:
        found = re.fullmatch(r"(\w+)\.(\w+)=(\w+)", spec)
        if found is None:
            raise argparse.ArgumentTypeError(f"--rename {spec!r}: expected Type.old=new")
        out[(found[1], found[2])] = found[3]
    return out


def differences(a: Any, b: Any, path: str = "") -> Iterator[tuple[str, Any, Any]]:
    """(path, value in a, value in b) of every place where canonical `a` and `b` differ;
    a list of another length differs at its `len`."""
    if isinstance(a, dict) and isinstance(b, dict):
        for key in sorted(a.keys() | b.keys()):
            yield from differences(a.get(key, ABSENT), b.get(key, ABSENT), f"{path}.{key}")
    elif isinstance(a, list) and isinstance(b, list):
        for i, (x, y) in enumerate(zip(a, b, strict=False)):
            yield from differences(x, y, f"{path}[{i}]")
        if len(a) != len(b):
            yield f"{path}.len", len(a), len(b)
    elif a != b or type(a) is not type(b):
        yield path, a, b


def compare_snapshots(new: dict[str, Any], old: dict[str, Any]) -> dict[str, Any]:
    """Where the snapshot files `new` and `old` (canonical, renames applied) differ: the
    first cycle and field, and each differing field (list positions as [*]) with how many
    times it differs."""
    if new["settings"] != old["settings"]:
        return {"same": False, "settings_differ": {"new": new["settings"], "old": old["settings"]}}
    first: dict[str, Any] | None = None
    fields: Counter[str] = Counter()
    cycles_differ: list[int] = []
    for i, (x, y) in enumerate(zip(new["cycles"], old["cycles"], strict=False)):
        found = list(differences(x, y))
        if not found:
            continue
        cycles_differ.append(i)
        if first is None:
            path, in_new, in_old = found[0]
            first = {
                "cycle": i,
                "field": path.lstrip("."),
                "new": _short(in_new),
                "old": _short(in_old),
            }
        fields.update(re.sub(r"\[\d+\]", "[*]", p).lstrip(".") for p, _, _ in found)
    same_count = len(new["cycles"]) == len(old["cycles"])
    return {
        "same": first is None and same_count,
        "cycles": [len(new["cycles"]), len(old["cycles"])],
        "cycles_that_differ": cycles_differ[:20],
        "first_difference": first,
        "fields_that_differ": dict(fields.most_common(20)),
    }


def _short(value: Any) -> str:
    text = json.dumps(value, sort_keys=True)
    return text if len(text) <= 200 else text[:200] + "..."


class FixedClock:
    """The daemon's, the cluster's and Django's clock: moves only when told."""

    def __init__(self, start: float) -> None:
        self.now = start

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += max(0.0, seconds)

    def dt(self) -> datetime:
        return datetime.fromtimestamp(self.now, tz=UTC)


@contextlib.contextmanager
def django_clock(clock: FixedClock) -> Iterator[None]:
    """`django.utils.timezone.now` (auto_now fields, the transitions' times) on `clock`."""
    from django.utils import timezone

    before = timezone.now
    timezone.now = clock.dt
    try:
        yield
    finally:
        timezone.now = before


def build_snapshots(
    cycles: int, per_team: dict[str, int], step_s: float, profile: Any, window: int = 500
) -> list[dict[str, Any]]:
    """Seed the database `fresh_database` set up (as `bench.daemon_drain` does), run the
    daemon's first `cycles` cycles on the simulated cluster and the fixed clock, and return
    each cycle's snapshot and decisions in canonical form."""
    from bench.daemon_drain import queue
    from bench.kueue_e2e import FLAVOR
    from scheduler.leader import Lease

    simulated = ("scheduler.backends.simulated.cluster", "scheduler.backends.simulated")
    cluster_class = _first("SimulatedCluster", simulated)
    make_nodes = _first("make_nodes", ("scheduler.backends.simulated.inventory", *simulated))
    daemon_class = _first("Daemon", DAEMON_MODULES)
    clock = FixedClock(CLOCK_START)
    calls: list[tuple[Any, Any, Any]] = []
    with django_clock(clock):
        queue(per_team)
        backend = cluster_class(
            make_nodes(75, FLAVOR, 8), clock=clock, start_delay_s=0.0, grace_cap_s=0.0
        )
        daemon = daemon_class(backend, lease=Lease(ttl_s=3600), profile=profile,
                              clock=clock, sleep=clock.advance, max_pending=window,
                              per_queue=50, sync_every_s=600.0)  # fmt: skip
        daemon.lease.acquire()
        _sync_nodes(daemon)
        with recorded_engine(calls):
            # A step that fails before the engine (logged by the daemon) is not a cycle.
            for _ in range(4 * cycles):
                if len(calls) >= cycles:
                    break
                clock.advance(step_s)
                daemon.step()
    return [
        {"snapshot": canonical(snapshot), "decisions": canonical(result)}
        for snapshot, _, result in calls
    ]


def _sync_nodes(daemon: Any) -> None:
    sync: Callable[..., Any] | None = getattr(daemon, "sync_nodes", None)
    if sync is not None:
        sync(force=True)
    else:
        _first("sync_nodes", ("scheduler.daemon_health",))(daemon, force=True)


def _commit() -> str:
    found = subprocess.run(
        ["git", "rev-parse", "HEAD"],  # noqa: S607 - git of the checkout being measured
        capture_output=True,
        text=True,
        check=False,
        cwd=Path(daemon_module().__file__ or ".").parent,
    )
    return found.stdout.strip()


def snapshots(args: argparse.Namespace) -> dict[str, Any]:
    loaded, used = announced(args.profile)
    fresh_database(args.database_url)
    per_team = {"medium": 100, "small": 350}
    if args.per_team:
        per_team = dict.fromkeys(per_team, args.per_team)
    settings = {"cycles": args.cycles, "per_team": per_team, "step_s": args.step_s,
                "profile_sha256": used["sha256"], "format": SNAPSHOT_FORMAT}  # fmt: skip
    built = build_snapshots(args.cycles, per_team, args.step_s, loaded.profile)
    data = {"settings": settings, "commit": _commit(), "cycles": built}
    args.out.write_text(json.dumps(data, sort_keys=True) + "\n")
    figures: dict[str, Any] = {"out": str(args.out), "cycles": len(built), "commit": data["commit"]}
    if args.compare:
        figures["compare"] = diff_files(args.out, args.compare, parse_renames(args.rename))
    return figures


def diff_files(new: Path, old: Path, renames: Mapping[tuple[str, str], str]) -> dict[str, Any]:
    loaded = [renamed(json.loads(p.read_text()), renames) for p in (new, old)]
    return {"commits": [d.get("commit") for d in loaded]} | compare_snapshots(*loaded)


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
    snap = sub.add_parser("snapshots", help="the daemon's first snapshots as JSON, compared")
    snap.add_argument("--out", type=Path, required=True)
    snap.add_argument("--cycles", type=int, default=40)
    snap.add_argument("--per-team", type=int, help="jobs of each class per team (100/350)")
    snap.add_argument("--step-s", type=float, default=0.1, help="fixed-clock s between cycles")
    snap.add_argument("--database-url", default=DEFAULT_URL)
    snap.add_argument("--compare", type=Path, help="snapshots written by another version")
    snap.add_argument("--rename", action="append", default=[], metavar="Type.old=new")
    add_profile_argument(snap, "no-min-runtime")
    diff = sub.add_parser("diff", help="compare two files written by snapshots")
    diff.add_argument("new", type=Path)
    diff.add_argument("old", type=Path)
    diff.add_argument("--rename", action="append", default=[], metavar="Type.old=new")
    args = parser.parse_args(argv)
    if args.command == "record":
        print(json.dumps(record(args.out, args.database_url, args.profile), indent=2))
        return
    if args.command == "snapshots":
        parse_renames(args.rename)  # a bad spelling fails before the run, not after
        print(json.dumps(snapshots(args), indent=2))
        return
    if args.command == "diff":
        print(json.dumps(diff_files(args.new, args.old, parse_renames(args.rename)), indent=2))
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
