"""The CLI against a live server: `gantry(user, *argv)` runs `gantry *argv` logged in as that
persona (each with a config file of their own, logged in at their first command) and returns
(exit code, stdout, stderr)."""

from __future__ import annotations

import io
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from cli.main import main
from tests.conftest import Org

Gantry = Callable[..., tuple[int, str, str]]


@pytest.fixture
def gantry(live_server: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, org: Org) -> Gantry:
    """gantry("alice", "queue") -> (exit code, stdout, stderr), logged in as that persona."""
    monkeypatch.setenv("GANTRY_URL", live_server.url)
    monkeypatch.setenv("GANTRY_PASSWORD", "correct-horse-battery")
    monkeypatch.delenv("GANTRY_TOKEN", raising=False)

    def run(user: str, *argv: str) -> tuple[int, str, str]:
        monkeypatch.setenv("GANTRY_CONFIG", str(tmp_path / f"{user}.json"))
        out, err = io.StringIO(), io.StringIO()
        if not (tmp_path / f"{user}.json").exists():
            assert main(["login", user], out=io.StringIO(), err=err) == 0, err.getvalue()
        code = main(list(argv), out=out, err=err)
        return code, out.getvalue(), err.getvalue()

    return run
