"""The previous release, checked out and runnable beside the current tree (the upgrade test).

Its tree: `git worktree add --detach` of the commit `releases.toml` records (removed after).
Its Python: the current virtual environment when it already satisfies every requirement the
old `pyproject.toml` declares (extras `dev` included), checked requirement by requirement with
the installed distributions' versions. That is the common case: a release rarely changes its
dependencies, and a package the current tree added is simply not imported by the old code.
The old tree then runs with the current interpreter, its own folder first on `sys.path`
(working directory and PYTHONPATH), ahead of the current tree's editable install, whose
finder Python consults only after the path. `python -m venv --system-site-packages` would not
help: the current venv's packages are not the system's. When a requirement is not satisfied
(a pin moved), the old tree gets a venv of its own with `pip install -e <tree>[dev]`, which
needs the package index and minutes: `why` says which requirement forced it.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tomllib
from dataclasses import dataclass
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

from packaging.requirements import Requirement

from common.releases.records import REPO_ROOT, Release


@dataclass(frozen=True)
class OldTree:
    release: Release
    path: Path
    python: str
    why: str  # why this interpreter


def git(*args: str) -> str:
    done = subprocess.run(["git", "-C", str(REPO_ROOT), *args], capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"git {' '.join(args)}: {done.stderr.strip()}")
    return done.stdout


def unmet_requirements(pyproject: str) -> list[str]:
    """The requirements (dependencies and the `dev` extra) the running interpreter's
    installed distributions do not satisfy."""
    project = tomllib.loads(pyproject)["project"]
    wanted = [*project["dependencies"], *project.get("optional-dependencies", {}).get("dev", [])]
    unmet = []
    for text in wanted:
        requirement = Requirement(text)
        try:
            installed = version(requirement.name)
        except PackageNotFoundError:
            unmet.append(f"{text} (not installed)")
            continue
        if not requirement.specifier.contains(installed, prereleases=True):
            unmet.append(f"{text} (installed {installed})")
    return unmet


def has_commit(commit: str) -> bool:
    probe = ["git", "-C", str(REPO_ROOT), "cat-file", "-e", f"{commit}^{{commit}}"]
    return subprocess.run(probe, capture_output=True).returncode == 0


def unavailable(commit: str) -> str | None:
    """None when this clone has `commit`. A shallow clone (CI's may be) is deepened first
    (`git fetch --unshallow`); the reason to skip when that cannot be done. A full clone
    without it is an error of releases.toml's, not a reason to skip: AssertionError."""
    if has_commit(commit):
        return None
    shallow = subprocess.run(
        ["git", "-C", str(REPO_ROOT), "rev-parse", "--is-shallow-repository"],
        capture_output=True,
        text=True,
    ).stdout.strip()
    assert shallow == "true", f"releases.toml names {commit}, which is not in this history"
    try:
        fetched = subprocess.run(
            ["git", "-C", str(REPO_ROOT), "fetch", "--quiet", "--unshallow"],
            capture_output=True,
            text=True,
            timeout=300,
        )
    except subprocess.TimeoutExpired:
        return f"a shallow clone without {commit}, and `git fetch --unshallow` timed out"
    if has_commit(commit):
        return None
    why = fetched.stderr.strip() or f"exit {fetched.returncode}"
    return f"a shallow clone without {commit}, and `git fetch --unshallow` failed: {why}"


def check_out(release: Release, where: Path) -> OldTree:
    # Named apart per process: two xdist workers may check the same release out at once.
    path = where / f"gantry-{release.version}-{os.getpid()}"
    if subprocess.run(
        ["git", "-C", str(REPO_ROOT), "cat-file", "-e", f"{release.commit}^{{commit}}"],
        capture_output=True,
    ).returncode:
        raise RuntimeError(
            f"releases.toml names {release.commit} ({release.version}), which this clone does "
            "not have: the upgrade test needs the repository's history (not a shallow clone)"
        )
    git("worktree", "add", "--detach", str(path), release.commit)
    unmet = unmet_requirements((path / "pyproject.toml").read_text())
    if not unmet:
        return OldTree(release, path, sys.executable, "the current venv satisfies its requirements")
    venv = where / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    pip = [str(venv / "bin" / "python"), "-m", "pip", "install", "--quiet"]
    subprocess.run([*pip, "-e", f"{path}[dev]"], check=True)
    return OldTree(release, path, str(venv / "bin" / "python"), f"a venv of its own: {unmet}")


def remove(tree: OldTree) -> None:
    git("worktree", "remove", "--force", str(tree.path))
