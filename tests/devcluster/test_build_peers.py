"""The peers' builds (Kueue) are opt-in: the control plane's own `build` and `up` never wait
for them, and `build --peers` does."""

from __future__ import annotations

from pathlib import Path

import pytest

from devcluster import build
from devcluster.versions import COMMANDS, PEERS


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("GANTRY_CONTROL_PLANE_CACHE", str(tmp_path))
    for module, (release, commands) in COMMANDS.items():
        if module in PEERS:
            continue
        (tmp_path / f"{module}-{release}").mkdir()
        for name in commands:
            (tmp_path / f"{module}-{release}" / name).write_bytes(b"")
    return tmp_path


def test_the_plane_is_complete_without_the_peers(cache: Path) -> None:
    assert build.missing() == []
    assert sorted(build.missing(peers=True)) == sorted(PEERS)


def test_build_all_does_not_build_a_missing_peer_unless_asked(
    cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    built: list[str] = []
    monkeypatch.setattr(build, "_build", lambda module, say: built.append(module))
    monkeypatch.setattr(build.shutil, "which", lambda name: "/usr/bin/go")
    build.build_all(say=lambda message: None)
    assert built == []
    build.build_all(say=lambda message: None, peers=True)
    assert sorted(built) == sorted(PEERS) == ["jobset", "kueue", "lws"]
