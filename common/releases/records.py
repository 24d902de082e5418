"""The releases recorded in `releases.toml` (docs/releasing.md), and what a release records of
the tree: each app's last migration.

`releases.toml` lists every release oldest first, each with its version, date, commit and the
migrations state it shipped. The commit is written in a follow-up commit: a commit cannot
name its own hash. The upgrade test (tests/upgrade/) checks out the previous release's commit
from this file; the release test (tests/test_releases.py) checks every entry against the
repository's history.
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass, field
from datetime import date
from pathlib import Path

from django.apps import apps
from django.db.migrations.loader import MigrationLoader

REPO_ROOT = Path(__file__).resolve().parents[2]
RELEASES_FILE = REPO_ROOT / "releases.toml"


@dataclass(frozen=True)
class Release:
    version: str
    date: date
    commit: str  # "" until the follow-up commit records it
    migrations: dict[str, str] = field(default_factory=dict)  # app label -> last migration


def load_releases(path: Path = RELEASES_FILE) -> list[Release]:
    """The recorded releases, oldest first, as the file lists them."""
    data = tomllib.loads(path.read_text())
    return [
        Release(
            version=entry["version"],
            date=entry["date"],
            commit=entry.get("commit", ""),
            migrations=dict(entry.get("migrations", {})),
        )
        for entry in data.get("releases", [])
    ]


def previous_release(releases: list[Release]) -> Release | None:
    """The latest release whose commit is recorded: what an installation upgrades from."""
    recorded = [r for r in releases if r.commit]
    return recorded[-1] if recorded else None


def project_apps() -> list[str]:
    """The labels of the project's own apps that have migrations, in settings order."""
    return [
        config.label
        for config in apps.get_app_configs()
        if _is_own(Path(config.path)) and (Path(config.path) / "migrations").is_dir()
    ]


def _is_own(path: Path) -> bool:
    # The virtual environment may live inside the repository (.venv/).
    return path.is_relative_to(REPO_ROOT) and "site-packages" not in path.parts


def migration_state() -> dict[str, str]:
    """Each project app's last migration on disk (the leaf of its graph), as a release
    records it. An app with two leaves has a missing merge: `makemigrations --check` fails
    on it first."""
    graph = MigrationLoader(None, ignore_no_migrations=True).graph
    return {
        label: max(name for app, name in graph.leaf_nodes() if app == label)
        for label in project_apps()
    }
