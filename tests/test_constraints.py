"""The pinned versions (constraints.txt) that `make venv`, CI and the image install: every
dependency pyproject.toml declares is pinned there, at a version its specifier admits, and the
environment running the suite has that version (an unpinned stubs release once broke CI)."""

from __future__ import annotations

import tomllib
from importlib.metadata import PackageNotFoundError, version

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from common.releases.records import REPO_ROOT


def declared() -> list[Requirement]:
    project = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]
    lines = list(project["dependencies"])
    for extra in project.get("optional-dependencies", {}).values():
        lines.extend(extra)
    return [Requirement(line) for line in lines]


def pinned() -> dict[str, str]:
    pins: dict[str, str] = {}
    for raw in (REPO_ROOT / "constraints.txt").read_text().splitlines():
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        name, sep, at = line.partition("==")
        assert sep, f"constraints.txt pins with '==' only: {raw!r}"
        pins[canonicalize_name(name)] = at.strip()
    return pins


def test_every_declared_dependency_is_pinned_at_a_version_it_admits() -> None:
    pins = pinned()
    missing = [str(r) for r in declared() if canonicalize_name(r.name) not in pins]
    assert not missing, f"not in constraints.txt (run `make lock`): {missing}"
    refused = [
        f"{r} (pinned {pins[canonicalize_name(r.name)]})"
        for r in declared()
        if not r.specifier.contains(pins[canonicalize_name(r.name)], prereleases=True)
    ]
    assert not refused, f"constraints.txt pins versions pyproject.toml refuses: {refused}"


def test_the_suite_runs_on_the_pinned_versions() -> None:
    pins = pinned()
    drift = []
    for requirement in declared():
        want = pins[canonicalize_name(requirement.name)]
        try:
            installed = version(requirement.name)
        except PackageNotFoundError:
            installed = "not installed"
        if installed != want:
            drift.append(f"{requirement.name}: {installed}, pinned {want}")
    assert not drift, f"installed versions differ from constraints.txt (`make venv`): {drift}"
