"""The benchmarks' scheduling profiles: files under `bench/profiles/`, loaded as the daemon
loads its own (`scheduler.profiles.files.read_profile`), and named in every benchmark's output."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from scheduler.profiles.files import LoadedProfile, read_profile

PROFILES_DIR = Path(__file__).parent / "profiles"


def bench_profile(name_or_path: str) -> LoadedProfile:
    """A file of `bench/profiles/` by its name (`no-min-runtime`), or any profile file."""
    path = Path(name_or_path)
    if not path.suffix:
        path = PROFILES_DIR / f"{name_or_path}.yaml"
    return read_profile(path)


def add_profile_argument(parser: argparse.ArgumentParser, default: str) -> None:
    parser.add_argument(
        "--profile",
        default=default,
        help=f"scheduling profile: a name in bench/profiles/ or a file (default {default})",
    )


def announced(name_or_path: str) -> tuple[LoadedProfile, dict[str, Any]]:
    """Load the profile, say which on stderr, and return it with the record the output
    carries (`"profile": {...}`)."""
    loaded = bench_profile(name_or_path)
    print(f"bench: {loaded.describe()}", file=sys.stderr)
    return loaded, profile_output(loaded)


def profile_output(loaded: LoadedProfile) -> dict[str, Any]:
    try:
        shown = str(Path(loaded.source).relative_to(Path.cwd()))
    except ValueError:
        shown = loaded.source
    return {"name": loaded.profile.name, "file": shown, "sha256": loaded.sha256}
