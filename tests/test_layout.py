"""The repository's shape, as the foundation issue and ARCHITECTURE.md describe it."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

REQUIRED = [
    "manage.py",
    "pyproject.toml",
    "config",
    "platform",
    "common",
    "tenants",
    "scheduler",
    "billing",
    "templates",
    "docker-compose.yml",
    "tests/__init__.py",
    "README.md",
    "Makefile",
    ".ci/run",
    "scheduler/core",
    "scheduler/backends",
    "bench",
]


def test_top_level_layout_exists() -> None:
    missing = [path for path in REQUIRED if not (ROOT / path).exists()]
    assert not missing, missing


def test_readme_opens_with_the_two_commands() -> None:
    readme = (ROOT / "README.md").read_text()
    first_block = re.search(r"```(?:sh|bash|console)?\n(.*?)```", readme, re.S)
    assert first_block is not None, "README needs a code block with the two commands"
    commands = [
        line.split("#")[0].strip()
        for line in first_block.group(1).splitlines()
        if line.strip() and not line.strip().startswith("#")
    ]
    assert commands[:2] == ["make run", "make test"], commands
    assert readme.index("make run") < 800, "the two commands must open the README"


def test_ci_runs_the_readme_test_command() -> None:
    script = (ROOT / ".ci/run").read_text()
    assert re.search(r"^make test\b", script, re.M), script


def test_every_environment_variable_read_is_documented() -> None:
    readme = (ROOT / "README.md").read_text()
    names: set[str] = set()
    for path in ROOT.glob("config/*.py"):
        names |= set(
            re.findall(
                r"""(?:environ\.get|env_bool|env_list)\(\s*["']([A-Z_]+)["']""", path.read_text()
            )
        )
    assert names, "no environment variables found; the pattern is stale"
    undocumented = sorted(name for name in names if f"`{name}`" not in readme)
    assert not undocumented, undocumented
