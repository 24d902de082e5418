"""Releases (issue 40): one version everywhere it is shown, a CHANGELOG section per release,
and every `releases.toml` entry true to the repository's history (docs/releasing.md)."""

from __future__ import annotations

import re
import shutil
import subprocess
import tomllib
from io import StringIO
from typing import Any

import pytest
from django.core.management import call_command
from django.test import Client

from cli.main import main as gantry
from common.releases.records import REPO_ROOT, load_releases, migration_state, previous_release
from common.releases.version import gantry_version
from tests.upgrade.previous import unavailable

PYPROJECT = REPO_ROOT / "pyproject.toml"


def declared_version() -> str:
    return str(tomllib.loads(PYPROJECT.read_text())["project"]["version"])


def git(*args: str) -> str:
    return subprocess.run(
        ["git", "-C", str(REPO_ROOT), *args], capture_output=True, text=True, check=True
    ).stdout


def has_history() -> bool:
    if shutil.which("git") is None:
        return False
    probe = ["git", "-C", str(REPO_ROOT), "rev-parse", "--git-dir"]
    return subprocess.run(probe, capture_output=True).returncode == 0


def test_the_installed_version_is_the_declared_one() -> None:
    """A stale install (pyproject bumped, `make venv` not run) shows an old version."""
    assert re.fullmatch(r"\d+\.\d+\.\d+", declared_version())
    assert gantry_version() == declared_version()


def test_the_changelog_has_a_section_for_every_release() -> None:
    changelog = (REPO_ROOT / "CHANGELOG.md").read_text()
    sections = re.findall(r"^## \[(\d+\.\d+\.\d+)\] - (\d{4}-\d{2}-\d{2})$", changelog, re.M)
    assert "## [Unreleased]" in changelog
    assert declared_version() in dict(sections)
    for release in load_releases():
        assert (release.version, release.date.isoformat()) in sections, release


def test_gantry_version_prints_the_version(capsys: Any) -> None:
    with pytest.raises(SystemExit) as exit_:
        gantry(["--version"])
    assert exit_.value.code == 0
    assert capsys.readouterr().out == f"gantry {declared_version()}\n"


def test_healthz_shows_the_version_to_anyone(db: Any) -> None:
    body = Client().get("/healthz").json()
    assert body["version"] == declared_version()


def test_the_portal_footer_shows_the_version(db: Any) -> None:
    html = Client().get("/accounts/login/").content.decode()
    footer = re.search(r'<footer class="footer">(.*?)</footer>', html, re.S)
    assert footer is not None and f"Gantry {declared_version()} " in footer.group(1)


def test_the_api_schema_carries_the_version(db: Any) -> None:
    """The OpenAPI document's `info.version` is the release (a literal would stay behind a bump)."""
    from drf_spectacular.generators import SchemaGenerator

    schema = SchemaGenerator().get_schema(request=None, public=True)
    assert schema["info"]["version"] == declared_version()


def test_release_record_prints_this_trees_entry() -> None:
    out = StringIO()
    call_command("release_record", "--commit", "0" * 40, stdout=out)
    entry = tomllib.loads(out.getvalue())["releases"][0]
    assert entry["version"] == declared_version()
    assert entry["commit"] == "0" * 40
    assert entry["migrations"] == migration_state()
    assert {"tenants", "scheduler", "billing", "whatif"} <= set(entry["migrations"])


def last_migrations_at(commit: str) -> dict[str, str]:
    names = git("ls-tree", "-r", "--name-only", commit).split()
    state: dict[str, str] = {}
    for path in names:
        match = re.fullmatch(r"(\w+)/migrations/(\d{4}_\w+)\.py", path)
        if match:
            app, name = match.groups()
            state[app] = max(state.get(app, name), name)
    return state


@pytest.mark.skipif(not has_history(), reason="no git history in this copy of the tree")
def test_every_recorded_release_matches_history() -> None:
    releases = load_releases()
    assert releases, "releases.toml records no release"
    versions = [r.version for r in releases]
    assert len(set(versions)) == len(versions), versions
    assert previous_release(releases) is not None, "no release has its commit recorded yet"
    for release in releases:
        if not release.commit:
            # only the newest may wait for its follow-up commit (docs/releasing.md, step 5)
            assert release is releases[-1], release
            continue
        assert re.fullmatch(r"[0-9a-f]{40}", release.commit), release
        if (why := unavailable(release.commit)) is not None:
            pytest.skip(why)
        ancestor = [
            "git",
            "-C",
            str(REPO_ROOT),
            "merge-base",
            "--is-ancestor",
            release.commit,
            "HEAD",
        ]
        assert subprocess.run(ancestor).returncode == 0, (
            f"{release.commit} is not in HEAD's history"
        )
        pyproject = tomllib.loads(git("show", f"{release.commit}:pyproject.toml"))
        assert pyproject["project"]["version"] == release.version
        assert last_migrations_at(release.commit) == release.migrations
